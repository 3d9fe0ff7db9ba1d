/**
 * The edge's dispatcher (docs/edge.md, "Delivery"): one per isolate, held by its
 * `EdgeState`. It owns what attempts share across requests (the origin pool and its health
 * view, the retry budget, the credential ring, what the isolate remembers of its Batchers)
 * and turns one planned completion into its candidates, its opener and its health reports
 * for the failover loop (`failover.ts`). The retry levels and their order: `retry.ts`.
 */
import type { Verdict } from "../../contracts/breaker.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import type { ModelConfig } from "../../contracts/config/models.ts";
import { batchingPlan } from "../../contracts/config/plans.ts";
import { type RegionConfig, originServes } from "../../contracts/config/regions.ts";
import { CredentialRing } from "../../contracts/credentials.ts";
import { type DeliveryMode, pipesRaw } from "../../contracts/delivery.ts";
import { DEFAULT_QUARANTINE_MS, OriginHealth } from "../../contracts/origin-health.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { AttemptRoute } from "../../durable-objects/batcher/types.ts";
import { type EdgeBreakers, breakerRegion } from "../health/breakers.ts";
import {
  type CanaryCopies,
  type CanaryPlan,
  armAvoids,
  armCandidates,
  armFirstAvoids,
} from "../health/canaries.ts";
import { OriginPool, type RegionOrigin } from "./origin-pool.ts";
import type { Settlement } from "../accounts/settlement.ts";
import { batcherOpener } from "./batcher.ts";
import { BatcherMemo } from "./batcher-memo.ts";
import { type DispatchOptions, dispatchCompletion } from "./failover.ts";
import { type ItemOpener, directOpener } from "./opener.ts";
import { unservedUsage } from "./generated.ts";
import { OutcomeAsks } from "./outcome-asks.ts";
import { RetryBudget } from "./retry-budget.ts";

/** One planned completion, as the dispatcher takes it. */
export interface CompletionDispatch {
  config: ResolvedConfig;
  path: ItemPath;
  /** The first model to try (the plan's). */
  model: ModelConfig;
  /** How the client gets its answer (the plan's decision). */
  delivery: DeliveryMode;
  /** Estimated prompt tokens of the longest sequence, and completion tokens one may produce. */
  promptTokens: number;
  maxTokens: number;
  /** The body text sent to the origins (only a model alias replaced). */
  body: string;
  /** Lower-case headers forwarded to the engine. */
  headers: Record<string, string>;
  /** The edge's headers every answer carries (see `AnswerOptions.answerHeaders`). */
  answerHeaders?: readonly (readonly [string, string])[];
  /** Regions to try, nearest first. */
  regions: readonly RegionConfig[];
  /** The origin `x-warmgate-origin` names and its region: the only one tried (null: any). */
  pinned: { id: string; region: RegionConfig } | null;
  settlement: Settlement;
  /** The Worker's bindings: the origins' credentials and the Batcher namespace. */
  env: Env;
  /** What a Batcher places the request by: key tier, priority header, key id, prefix route. */
  lane: {
    tier: string | undefined;
    priority: string | undefined;
    keyId: string | undefined;
    route: (model: string) => AttemptRoute | null;
  };
  /** Aborts when the client disconnects. */
  signal: AbortSignal;
  /** Keeps the request alive for work that outlives the response. */
  waitUntil: (promise: Promise<unknown>) => void;
}

/** Candidates for one request, and whether they are the panic trickle (all breakers open). */
interface Ranked {
  candidates: RegionOrigin[];
  panicking: boolean;
}

/** The isolate's one dispatcher; see the file header. */
export class Dispatcher {
  // Load and failure memo of the origins this isolate sends to (breakers + quarantine).
  readonly #pool: OriginPool;
  readonly #breakers: EdgeBreakers;
  readonly #canaries: CanaryCopies;
  readonly #retryBudget = new RetryBudget();
  readonly #batchers = new BatcherMemo();
  // Straight to an origin, on the isolate's ring (which credential each origin is on).
  readonly #openDirect: ItemOpener = directOpener(new CredentialRing());
  // What answers that ended without an END generated, asked of their origins together.
  readonly #asks = new OutcomeAsks();

  constructor(breakers: EdgeBreakers, canaries: CanaryCopies) {
    this.#breakers = breakers;
    this.#canaries = canaries;
    this.#pool = new OriginPool(new OriginHealth(DEFAULT_QUARANTINE_MS, breakers.cache));
  }

  /** Sends the completion to its origins and answers with their response (or throws). */
  async dispatch(request: CompletionDispatch): Promise<Response> {
    const { config, model, settlement } = request;
    const canary = this.#canaries.plan(config, model.id);
    const { candidates, panicking } = await this.#rank(request, canary);
    // Unserved, it is billed for what the attempts it gave up on generated.
    settlement.onUnserved((record) => unservedUsage(record, settlement.gaveUp, request.env));
    const response = await dispatchCompletion({
      requestId: settlement.requestId,
      path: request.path,
      body: request.body,
      model: model.id,
      candidates,
      quarantineMs: (region) => batchingPlan(config, region, model.id)?.setup.quarantineMs,
      attempts: settlement.attempts,
      gaveUp: settlement.gaveUp,
      retryBudget: this.#retryBudget,
      avoidAlways: [...(canary === null ? [] : armAvoids(canary)), ...pinnedAvoids(request.pinned)],
      ...(canary !== null && { avoidFirst: armFirstAvoids(canary, candidates) }),
      pool: this.#pool,
      limits: config.limits,
      delivery: request.delivery,
      piped: pipesRaw(request.delivery, request.maxTokens),
      headers: request.headers,
      ...(request.answerHeaders !== undefined && { answerHeaders: request.answerHeaders }),
      secrets: request.env,
      lookup: this.#asks.lookup,
      onSettled: (settled) => settlement.settle(settled),
      onReleased: (released) => settlement.release(released),
      signal: request.signal,
      ...(config.breakers.enabled && this.#healthReports(request)),
      // A panic request goes straight: every Batcher keeps open breakers' origins out.
      open: panicking ? this.#openDirect : this.#batcherOpener(request),
    });
    settlement.hold();
    return response;
  }

  /**
   * The request's candidates, by load and health (and its canary arm); with every breaker
   * open, after a refresh, Envoy's panic mode: a bounded trickle (docs/failover.md).
   */
  async #rank(request: CompletionDispatch, canary: CanaryPlan | null): Promise<Ranked> {
    const { config, regions, model, settlement, waitUntil, pinned } = request;
    const now = Date.now();
    const breakers = config.breakers.enabled;
    if (breakers) for (const work of this.#breakers.sync(config, regions, now)) waitUntil(work);
    let ranked = this.#pool.candidates(regions, model.id, now);
    let panicking = false;
    if (ranked.length === 0 && breakers) {
      // The copy may be stale: a breaker that closed since is seen by this request, not the
      // next one.
      await Promise.all(
        regions.map((region) => this.#breakers.cache.refresh(breakerRegion(config, region), now)),
      );
      ranked = this.#pool.candidates(regions, model.id, Date.now());
      if (ranked.length === 0) {
        ranked = this.#pool.panic(regions, model.id, Date.now());
        panicking = ranked.length > 0;
      }
    }
    // A pinned request goes to its origin or nowhere: it asks about that origin.
    if (pinned !== null) ranked = ranked.filter((c) => c.origin.id === pinned.id);
    const candidates =
      canary === null ? ranked : armCandidates(canary, ranked, (id) => this.#pool.busy(id, now));
    if (canary !== null) {
      const sync = this.#canaries.sync(canary.spec, now);
      if (sync !== null) waitUntil(sync);
      settlement.onSettled(
        (settled) =>
          this.#canaries.record(canary, settled, settlement.attempts, Date.now()) ?? undefined,
      );
    }
    if (candidates.length === 0 && breakers) {
      throw this.#breakers.allOpen(
        regions,
        (origin) => originServes(origin, model.id) && (pinned === null || origin.id === pinned.id),
        now,
      );
    }
    return { candidates, panicking };
  }

  /** How the failover loop tells the breakers what it saw (with breakers on). */
  #healthReports(request: CompletionDispatch): Partial<DispatchOptions> {
    const { config, waitUntil } = request;
    const breakers = this.#breakers;
    return {
      onOutcome: (region: RegionConfig, origin: string, verdict: Verdict) => {
        const at = breakerRegion(config, region);
        const sync = breakers.cache.record(at, origin, verdict, Date.now());
        if (sync !== null) waitUntil(sync);
      },
      slowFirstByteMs: config.breakers.settings.slowFirstByteMs,
      watchBreaker: (origin: string, giveUp: () => void) => breakers.watch(origin, giveUp),
      onUpstreamFailure: (region: RegionConfig) => {
        const sync = breakers.cache.sync(breakerRegion(config, region), Date.now(), true);
        if (sync !== null) waitUntil(sync);
      },
    };
  }

  /** Each attempt through its region's Batcher, or straight where batching is off or idle. */
  #batcherOpener(request: CompletionDispatch): ItemOpener {
    const { config, lane } = request;
    return batcherOpener(
      {
        namespace: request.env.BATCHER,
        config,
        model: request.model.id,
        tier: lane.tier,
        priority: lane.priority,
        keyId: lane.keyId,
        route: lane.route,
        promptTokens: request.promptTokens,
        maxTokens: request.maxTokens,
        deadline: Date.now() + config.limits.requestTimeoutMs,
        isolateInFlight: (ids) => ids.reduce((n, id) => n + this.#pool.inFlight(id), 0),
        waitUntil: request.waitUntil,
        signal: request.signal,
      },
      this.#batchers,
      this.#openDirect,
    );
  }
}

/** The origins a pinned request's region holds beside its pin: its Batcher may use none. */
function pinnedAvoids(pinned: CompletionDispatch["pinned"]): string[] {
  if (pinned === null) return [];
  return pinned.region.origins.filter((origin) => origin.id !== pinned.id).map((o) => o.id);
}
