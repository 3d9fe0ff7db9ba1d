/**
 * The one failover loop of the edge (docs/edge.md, "Delivery"): each attempt goes through an
 * `ItemOpener` (`opener.ts`), straight to the candidate origin as a batch of one or through
 * the region's `Batcher` (`batcher.ts`), which both answer with an `OpenItem` (`item.ts`).
 * Before the first byte reaches the client a failing origin is replaced by the next candidate,
 * within the retry budget, and origins that failed are avoided; `response.ts` delivers it.
 */
import { logWarn } from "../../contracts/log.ts";
import type { Limits } from "../../contracts/config/limits.ts";
import type { RegionConfig } from "../../contracts/config/regions.ts";
import { type OriginFailureKind, failedEverywhere, originFailure } from "../../contracts/errors.ts";
import type { Verdict } from "../../contracts/breaker.ts";
import { judgeHead } from "../../contracts/origin-health.ts";
import { type ItemPath, attemptId } from "../../contracts/protocol/schema.ts";
import type { RegionOrigin } from "./origin-pool.ts";
import type { GivenUp } from "../accounts/settlement.ts";
import type { RequestAttempt } from "../../durable-objects/key-account/types.ts";
import type { ItemAttempt } from "./direct.ts";
import type { ItemOpener } from "./opener.ts";
import { cancelGivenUp, givenUpAt } from "./generated.ts";
import { busyEverywhere, withAttempts } from "./refusals.ts";
import { type AnswerOptions, readWhole, respond, streams } from "./response.ts";
import type { RetryBudget } from "./retry-budget.ts";
import {
  type NextAttempt,
  attemptsAllowed,
  crossesRegion,
  nextAttempt,
  nextCandidates,
  ranOn,
} from "./retry.ts";
import type { OpenItem } from "./item.ts";

/** What the edge sends and how it reports the end (with what the response lifecycle needs). */
export interface DispatchOptions extends AnswerOptions {
  path: ItemPath;
  /** The client's body text (with only the model alias replaced), forwarded as is. */
  body: string;
  limits: Limits;
  /** Lower-case headers forwarded to the engine. */
  headers: Record<string, string>;
  /** How each attempt reaches an origin (`directOpener`, `batcherOpener`). */
  open: ItemOpener;
  /** Straight to an origin, its stream is piped raw (`contracts/delivery.ts`, `pipesRaw`). */
  piped?: boolean;
  /** How each attempt went, for the breakers (docs/failover.md); not what a Batcher judged. */
  onOutcome?: (region: RegionConfig, origin: string, verdict: Verdict) => void;
  /** An origin silent this long (of this thread's on-time) is frozen. */
  slowFirstByteMs?: number;
  /**
   * How long an origin of `region` that failed is tried only after every healthy one: its
   * region and model's `origin_quarantine_ms`, overrides applied, as its Batchers have it
   * (undefined: the health rule's own).
   */
  quarantineMs?: (region: RegionConfig) => number | undefined;
  /** Calls `giveUp` should the origin's breaker open; answers how to stop watching. */
  watchBreaker?: (origin: string, giveUp: () => void) => () => void;
  /** An attempt through a Batcher failed: the region's breakers may have changed. */
  onUpstreamFailure?: (region: RegionConfig) => void;
  /** The isolate's retry budget; without one, retries are bounded by `retry_budget` alone. */
  retryBudget?: RetryBudget;
  /** Origins no attempt may go to (a canary's pool, for its baseline requests). */
  avoidAlways?: readonly string[];
  /** Origins the first attempt may not go to (the baseline, for a canary request). */
  avoidFirst?: readonly string[];
  /**
   * Where attempts given up on after reaching an origin are listed: should the request end
   * unserved, it is billed for what they generated (see `generated.ts`).
   */
  gaveUp?: GivenUp[];
  now?: () => number;
}

/**
 * Tries candidates until one answers; returns the client's response, or throws the
 * {@link ApiError} (502/503/504, or an opener's refusal) of the last failure when none did.
 * Each attempt is judged once by the rule of `contracts/origin-health.ts` (docs/failover.md).
 * Before a refusal, the attempts it gave up on are cancelled on their origins (listed in
 * `gaveUp`, so that the request is billed for what they generated: docs/key-account.md).
 */
export async function dispatchCompletion(options: DispatchOptions): Promise<Response> {
  const gaveUp: GivenUp[] = [];
  try {
    return await tryCandidates(options, gaveUp);
  } catch (error) {
    await cancelGivenUp(gaveUp, options.secrets);
    throw withAttempts(error, options.attempts);
  } finally {
    options.gaveUp?.push(...gaveUp);
  }
}

async function tryCandidates(options: DispatchOptions, gaveUp: GivenUp[]): Promise<Response> {
  const failover = new Failover(options, gaveUp);
  try {
    return await failover.run();
  } finally {
    // No second opinion came (one candidate, or the retries ran out): the 5xx counts.
    failover.convictSuspects();
  }
}

/** One attempt, opened: what came back, and what was noted while it was made. */
interface Opened {
  candidate: RegionOrigin;
  attempt: ItemAttempt;
  /** Its item id (unique across the request's models). */
  itemId: string;
  /** Its entry in the request's attempts. */
  listed: RequestAttempt;
  /** Its place among the candidates. */
  index: number;
  /** Judged slow while it waited: that was its verdict. */
  toldSlow: boolean;
  last: boolean;
}

/** The failover loop of one request: attempt, judge the HEAD, deliver; each its own step. */
class Failover {
  readonly #options: DispatchOptions;
  readonly #gaveUp: GivenUp[];
  readonly #now: () => number;
  // The request timeout bounds every attempt together.
  readonly #deadline: number;
  readonly #avoid: string[] = [];
  // The candidates in the order tried: re-ranked before each retry (`retry.ts`, level 2).
  #candidates: readonly RegionOrigin[];
  #failure: OriginFailureKind = "unavailable";
  // How many candidates the request may try (`retry.ts`, level 2).
  readonly #attempts: number;
  // Origins whose engine answered 5xx wait for another opinion: an origin that answers the
  // same request convicts them; the request is convicted once a second origin fails it too
  // and no origin of another region is left to ask (a whole region may be down).
  #suspects: { candidate: RegionOrigin; originId: string }[] = [];

  constructor(options: DispatchOptions, gaveUp: GivenUp[]) {
    this.#options = options;
    this.#gaveUp = gaveUp;
    this.#now = options.now ?? Date.now;
    this.#deadline = this.#now() + options.limits.requestTimeoutMs;
    this.#candidates = options.candidates;
    this.#attempts = attemptsAllowed(options.candidates.length, options.limits);
  }

  /** Tries the candidates in order (see `retry.ts`, level 2) until one is delivered. */
  async run(): Promise<Response> {
    const options = this.#options;
    const attempts = this.#attempts;
    const firstAttempt = options.attempts?.length ?? 0;
    options.retryBudget?.request(this.#now());
    for (let i = 0; i < attempts && i < this.#candidates.length; i++) {
      const next = this.#next(i);
      if (next === "timeout") this.#failure = "timeout";
      if (next === "budget_spent") logWarn("retry budget spent", { request_id: options.requestId });
      if (next !== "go") break;
      const last = i === Math.min(attempts, this.#candidates.length) - 1;
      const opened = await this.#attempt(i, firstAttempt + i, last);
      if (opened.attempt.kind === "failed") {
        this.#failed(opened, opened.attempt);
        continue;
      }
      const { item, originId } = opened.attempt;
      const judged = await this.#judgeHead(opened, item, originId);
      if (judged === null) continue;
      const response = await this.#deliver(opened, item, originId, judged === "ok");
      if (response !== null) return response;
    }
    throw originFailure(options.candidates.length === 0 ? "unavailable" : this.#failure);
  }

  /** Whether attempt `i` may go, its candidate re-ranked (see `retry.ts`, level 2). */
  #next(i: number): NextAttempt {
    const options = this.#options;
    const rank = (rest: RegionOrigin[]) => options.pool.rerank(rest, this.#now());
    if (i > 0) {
      // Those whose breaker opened meanwhile are out: none may be left.
      const order = nextCandidates(this.#candidates, i, rank, false);
      if (order === null) return "none_left";
      this.#candidates = order;
    }
    const state = { signal: options.signal, deadline: this.#deadline, limits: options.limits };
    const budget = options.retryBudget;
    const crossRegion = crossesRegion(this.#candidates, i);
    const next = nextAttempt(i, { ...state, now: this.#now(), budget, crossRegion });
    if (next !== "budget_spent") return next;
    // Spent on retries within regions: a region the request has not tried may still answer.
    // The candidates left were just ranked.
    const across = nextCandidates(this.#candidates, i, (rest) => rest, true);
    if (across === null) return next;
    this.#candidates = across;
    return "go";
  }

  /** Counts the 5xx of the origins that waited for another opinion. */
  convictSuspects(): void {
    for (const { candidate, originId } of this.#suspects) {
      this.#judge(candidate, originId, "failed");
    }
    this.#suspects = [];
  }

  /** Whether a candidate after `index` is in a region none of the suspects is in. */
  #regionLeftToAsk(index: number): boolean {
    const asked = new Set(this.#suspects.map((suspect) => suspect.candidate.region.id));
    return this.#candidates
      .slice(index + 1, this.#attempts)
      .some((candidate) => !asked.has(candidate.region.id));
  }

  /** Opens attempt `n` of the request at candidate `i`; a final refusal throws. */
  async #attempt(i: number, n: number, last: boolean): Promise<Opened> {
    const options = this.#options;
    const candidate = this.#candidates[i] as RegionOrigin;
    const planned = candidate.origin.id;
    options.pool.begin(planned);
    let unwatch: (() => void) | null = null;
    let toldSlow = false;
    // Unique across the request's models too (a model fallback dispatches again).
    const itemId = attemptId(options.requestId, n);
    const attempt = await options.open(candidate, {
      requestId: options.requestId,
      attemptId: itemId,
      path: options.path,
      body: options.body,
      headers: options.headers,
      firstByteTimeoutMs: options.limits.firstByteTimeoutMs,
      delivery: options.delivery,
      ...(options.piped === true && { piped: true }),
      itemTimeoutMs: options.limits.requestTimeoutMs,
      avoidOrigins: [
        ...this.#avoid,
        ...options.pool.blocked(candidate.region),
        ...(options.avoidAlways ?? []),
        ...(i === 0 ? (options.avoidFirst ?? []) : []),
      ],
      secrets: options.secrets,
      ...(options.signal !== undefined && { clientSignal: options.signal }),
      onStart: (giveUp) => {
        unwatch = options.watchBreaker?.(planned, giveUp) ?? null;
      },
      onSlowHead: () => {
        toldSlow = true;
        this.#judge(candidate, planned, "slow");
      },
      ...(options.slowFirstByteMs !== undefined && { silenceMs: options.slowFirstByteMs }),
    });
    (unwatch as (() => void) | null)?.();
    options.pool.end(planned);
    if (attempt.kind === "refused") throw attempt.error;
    if (attempt.originId !== null && attempt.originId !== planned) {
      this.#candidates = ranOn(this.#candidates, i, attempt.originId);
    }
    const listed: RequestAttempt = {
      region: candidate.region.id,
      origin: attempt.originId,
      result: "failed",
    };
    options.attempts?.push(listed);
    return { candidate, attempt, itemId, listed, index: i, toldSlow, last };
  }

  /** An attempt that failed before its HEAD: noted, judged, avoided from now on. */
  #failed(opened: Opened, attempt: Extract<ItemAttempt, { kind: "failed" }>): void {
    const options = this.#options;
    const { candidate, itemId } = opened;
    if (attempt.reported === true) options.onUpstreamFailure?.(candidate.region);
    // Refused or unreachable, an origin ran nothing; it may have, once it took the call
    // (an origin not named, only when its opener says so), or its call was lost on the way.
    const named = attempt.originId !== null && attempt.failure !== "unavailable";
    if (named || attempt.mayHaveRun === true) {
      const at = givenUpAt(options.candidates, attempt.originId, itemId, candidate.region.id);
      const { unreachable } = attempt;
      this.#gaveUp.push(...at.map((given) => (unreachable ? { ...given, unreachable } : given)));
    }
    // Its client left: the origin is no worse for it, and no other is tried (`nextAttempt`).
    if (attempt.clientGone === true) return;
    if (attempt.originId !== null) {
      // A Batcher judged its own call; an attempt sent straight is judged here.
      if (attempt.reported !== true && !opened.toldSlow) {
        this.#judge(candidate, attempt.originId, attempt.soft === true ? "slow" : "failed");
      }
      this.#quarantine(candidate, attempt.originId);
      this.#avoid.push(attempt.originId);
    }
    this.#failure = attempt.failure;
    logWarn("origin attempt failed", {
      request_id: options.requestId,
      origin: attempt.originId,
      detail: attempt.detail,
    });
  }

  /**
   * Judges an opened item's HEAD by the health rule (`contracts/origin-health.ts`): the
   * verdict of one to deliver, null to try the next candidate; throws the final error.
   */
  async #judgeHead(
    opened: Opened,
    item: OpenItem,
    originId: string,
  ): Promise<"ok" | "busy" | null> {
    const options = this.#options;
    const { candidate, last } = opened;
    const { status, headers } = item.head;
    const judged = judgeHead(status, headers);
    if (judged === "busy") {
      // Overload, never counted: avoided until its retry-after. A last 429 goes to the
      // client as it is (the SDKs back off by it); a last 503 becomes our own 503
      // `no_healthy_origin`, with the origin's retry-after.
      options.pool.reportBusy(originId, this.#now(), headers);
      opened.listed.result = "busy";
      if (!last || status === 503) item.cancel();
      if (!last) {
        this.#avoid.push(originId);
        this.#failure = "unavailable";
        return null;
      }
      if (status === 503) throw busyEverywhere(headers);
    }
    if (judged === "error") {
      this.#avoid.push(originId);
      // Tried last for a while, whoever is to blame (a ranking, not a verdict).
      this.#quarantine(candidate, originId);
      // The origin's own item timeout answers 504 (see origin/server.ts).
      this.#failure = status === 504 ? "timeout" : "bad_answer";
      logWarn("origin answered", { status, request_id: options.requestId, origin: originId });
      this.#suspects.push({ candidate, originId });
      if (this.#suspects.length > 1 && !this.#regionLeftToAsk(opened.index)) {
        // Origins failed it alike: the request's fault, and no origin's.
        this.#suspects = [];
        const text = await item
          .whole()
          .then(({ body }) => new TextDecoder().decode(body))
          .catch(() => "");
        throw failedEverywhere(text);
      }
      item.cancel();
      return null;
    }
    // Another origin answered: those that failed this request before were sick.
    if (judged === "ok") this.convictSuspects();
    return judged;
  }

  /**
   * Delivers a judged item through the response lifecycle (`response.ts`), streamed or read
   * whole first; null when a whole answer its origin cut is to be tried elsewhere.
   */
  async #deliver(
    opened: Opened,
    item: OpenItem,
    originId: string,
    answered: boolean,
  ): Promise<Response | null> {
    const options = this.#options;
    const { candidate, listed, itemId, last, toldSlow } = opened;
    // An answer is judged once it ended, whole or cut after its HEAD (by either path).
    const onEnd = (verdict: "ok" | "failed") => {
      if (!toldSlow && answered) this.#judge(candidate, originId, verdict);
    };
    const served = { region: candidate.region.id, origin: originId };
    // A last busy 429 goes to its client as it is, served by no one: still busy.
    if (streams(item, options)) {
      listed.result = answered ? "served" : "busy";
      if (answered) options.pool.reportSuccess(originId);
      options.pool.begin(originId);
      return respond(item, served, options, null, this.#deadline, this.#gaveUp, onEnd);
    }
    // A whole answer is read before the client sees anything: one its origin cut or failed
    // is tried again elsewhere (billed only should no answer be served: generated.ts).
    const read = await readWhole(item, this.#deadline - this.#now());
    const cut = !read.complete && !read.timedOut && item.head.status < 400;
    if (!read.timedOut) onEnd(cut ? "failed" : "ok");
    const retry = cut && !last && this.#now() < this.#deadline && options.signal?.aborted !== true;
    if (retry) {
      this.#gaveUp.push(...givenUpAt(options.candidates, originId, itemId, candidate.region.id));
      this.#avoid.push(originId);
      this.#quarantine(candidate, originId);
      this.#failure = "bad_answer";
      logWarn("origin failed mid-response", { request_id: options.requestId, origin: originId });
      return null;
    }
    // A whole answer cut on the last candidate reaches its client as an error, not served.
    listed.result = !answered ? "busy" : read.complete ? "served" : "failed";
    if (read.complete && answered) options.pool.reportSuccess(originId);
    options.pool.begin(originId);
    return respond(item, served, options, read, this.#deadline, this.#gaveUp);
  }

  #judge(candidate: RegionOrigin, origin: string, verdict: Verdict): void {
    this.#options.onOutcome?.(candidate.region, origin, verdict);
  }

  /** Tried only after every healthy origin for the region and model's quarantine. */
  #quarantine(candidate: RegionOrigin, originId: string): void {
    const quarantineMs = this.#options.quarantineMs?.(candidate.region);
    this.#options.pool.reportFailure(originId, this.#now(), quarantineMs);
  }
}
