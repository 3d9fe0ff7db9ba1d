/**
 * `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses` and `/v1/embeddings`:
 * validate, plan, pick origins and stream the origin's answer back unchanged.
 * See docs/edge.md.
 */
import { type Context, Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { batcherOpener } from "../delivery/batcher.ts";
import { PRIORITY_HEADER } from "../delivery/batcher-plan.ts";
import { dispatchCompletion } from "../delivery/failover.ts";
import { unservedUsage } from "../delivery/generated.ts";
import { RetryBudget } from "../delivery/retry-budget.ts";
import {
  armAvoids,
  armCandidates,
  armFirstAvoids,
  canaryPlan,
  recordCanary,
  syncCanary,
} from "../health/canaries.ts";
import { methodNotAllowed } from "../error-handler.ts";
import { clipped, invalidRequest, notFound } from "../../contracts/errors.ts";
import { replaceTopLevelString } from "../request/json-text.ts";
import { admitCompletion, verifyCredential } from "../middleware/auth.ts";
import { completionBody } from "../middleware/completion-body.ts";
import { withModelFallback } from "../delivery/model-fallback.ts";
import { planCompletion, sequenceAllowance } from "../middleware/completion-plan.ts";
import { waitUntilOf } from "../middleware/request-context.ts";
import { OriginPool } from "../delivery/origin-pool.ts";
import { allowOverride, attemptRoutes } from "../delivery/prefix-route.ts";
import {
  allOriginsOpen,
  breakerRegion,
  edgeBreakers,
  syncBreakers,
  watchBreaker,
} from "../health/breakers.ts";
import { batchingPlan } from "../../contracts/config/plans.ts";
import { type RegionConfig, originServes } from "../../contracts/config/regions.ts";
import { DEFAULT_QUARANTINE_MS, OriginHealth } from "../../contracts/origin-health.ts";
import { type CallerLocation, regionOrder } from "../delivery/region-choice.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { Verdict } from "../../contracts/breaker.ts";

/** Request header that picks the first region to try (for tests and diagnostics). */
export const REGION_OVERRIDE_HEADER = "x-warmgate-region";

// Per-isolate load and failure memo; a cache, so losing it with the isolate is harmless.
const originPool = new OriginPool(new OriginHealth(DEFAULT_QUARANTINE_MS, edgeBreakers));
// Per-isolate: retries at most a share of requests (limits.retry_ratio, retry_floor).
const retryBudget = new RetryBudget();

// Request headers worth passing to the engine; never credentials.
const FORWARDED_HEADERS = ["traceparent", "tracestate", "user-agent"] as const;

function callerLocation(request: Request): CallerLocation {
  const cf = request.cf as IncomingRequestCfProperties | undefined;
  return { colo: cf?.colo, country: cf?.country ?? undefined, continent: cf?.continent };
}

/** Sends the planned completion to the origins and answers with their response. */
export async function forward(c: Context<AppEnv>, path: ItemPath): Promise<Response> {
  const { config, plan, completion, requestId, settlement } = c.var;
  const override = c.req.header(REGION_OVERRIDE_HEADER);
  if (override !== undefined) allowOverride(c, REGION_OVERRIDE_HEADER, "region");
  // Reading `request.cf` parses it; with an override or a single region, where the caller
  // is decides nothing.
  const located = override === undefined && config.regions.length > 1;
  const order = regionOrder(config, located ? callerLocation(c.req.raw) : {}, override);
  if (order.kind === "unknown_region") {
    throw invalidRequest(
      `Unknown region '${clipped(order.region)}' in the ${REGION_OVERRIDE_HEADER} header.`,
      null,
      "invalid_region",
    );
  }
  const route = attemptRoutes(c);
  const headers: Record<string, string> = { "x-request-id": requestId };
  for (const name of FORWARDED_HEADERS) {
    const value = c.req.header(name);
    if (value !== undefined) headers[name] = value;
  }
  // Only an alias changes the text: the origin knows models by id.
  const body =
    completion.body.model === plan.model.id
      ? completion.text
      : replaceTopLevelString(completion.text, "model", plan.model.id);
  const now = Date.now();
  const breakers = config.breakers.enabled;
  const waitUntil = waitUntilOf(c);
  if (breakers) for (const work of syncBreakers(config, order.regions, now)) waitUntil(work);
  const canary = canaryPlan(config, plan.model.id);
  let ranked = originPool.candidates(order.regions, plan.model.id, now);
  let panicking = false;
  if (ranked.length === 0 && breakers) {
    // The copy may be stale: a breaker that closed since is seen by this request, not the
    // next one. Still all open: Envoy's panic mode, a bounded trickle (docs/failover.md).
    await Promise.all(
      order.regions.map((region) => edgeBreakers.refresh(breakerRegion(config, region), now)),
    );
    ranked = originPool.candidates(order.regions, plan.model.id, Date.now());
    if (ranked.length === 0) {
      ranked = originPool.panic(order.regions, plan.model.id, Date.now());
      panicking = ranked.length > 0;
    }
  }
  const candidates = canary === null ? ranked : armCandidates(canary, ranked);
  if (canary !== null) {
    const sync = syncCanary(canary.spec, now);
    if (sync !== null) waitUntil(sync);
    settlement.onSettled(
      (settled) => recordCanary(canary, settled, settlement.attempts, Date.now()) ?? undefined,
    );
  }
  if (candidates.length === 0 && breakers) {
    throw allOriginsOpen(order.regions, (origin) => originServes(origin, plan.model.id), now);
  }
  // Unserved, it is billed for what the attempts it gave up on generated.
  settlement.onUnserved((record) => unservedUsage(record, settlement.gaveUp, c.env));
  const { slowFirstByteMs } = config.breakers.settings;
  const response = await dispatchCompletion({
    requestId,
    path,
    body,
    model: plan.model.id,
    candidates,
    quarantineMs: (region) => batchingPlan(config, region, plan.model.id)?.setup.quarantineMs,
    attempts: settlement.attempts,
    gaveUp: settlement.gaveUp,
    retryBudget,
    ...(canary !== null && {
      avoidAlways: armAvoids(canary),
      avoidFirst: armFirstAvoids(canary, candidates),
    }),
    pool: originPool,
    limits: config.limits,
    delivery: plan.delivery,
    headers,
    secrets: c.env,
    onSettled: (settled) => settlement.settle(settled),
    onReleased: (released) => settlement.release(released),
    signal: c.req.raw.signal,
    ...(breakers && {
      onOutcome: (region: RegionConfig, origin: string, verdict: Verdict) => {
        const sync = edgeBreakers.record(
          breakerRegion(config, region),
          origin,
          verdict,
          Date.now(),
        );
        if (sync !== null) waitUntil(sync);
      },
      slowFirstByteMs,
      watchBreaker,
      onUpstreamFailure: (region: RegionConfig) => {
        const sync = edgeBreakers.sync(breakerRegion(config, region), Date.now(), true);
        if (sync !== null) waitUntil(sync);
      },
    }),
    // A panic request goes straight: every Batcher keeps open breakers' origins out.
    ...(!panicking && {
      open: batcherOpener({
        namespace: c.env.BATCHER,
        config,
        model: plan.model.id,
        tier: c.get("admission")?.tier,
        priority: c.req.header(PRIORITY_HEADER),
        keyId: c.get("caller")?.keyId,
        route,
        promptTokens: plan.promptTokens,
        maxTokens: sequenceAllowance(plan, plan.model),
        deadline: Date.now() + config.limits.requestTimeoutMs,
        isolateInFlight: (ids) => ids.reduce((n, id) => n + originPool.inFlight(id), 0),
        waitUntil: waitUntilOf(c),
        signal: c.req.raw.signal,
      }),
    }),
  });
  settlement.hold();
  return response;
}

/** The completion route group, mounted at `/v1`. */
export const completions = new Hono<AppEnv>()
  .post("/chat/completions", completionBody("chat"), planCompletion(), admitCompletion(), (c) =>
    withModelFallback(c, () => forward(c, "/v1/chat/completions")),
  )
  .all("/chat/completions", methodNotAllowed(["POST"]))
  .post("/completions", completionBody("completion"), planCompletion(), admitCompletion(), (c) =>
    withModelFallback(c, () => forward(c, "/v1/completions")),
  )
  .all("/completions", methodNotAllowed(["POST"]))
  .post("/responses", completionBody("responses"), planCompletion(), admitCompletion(), (c) =>
    withModelFallback(c, () => forward(c, "/v1/responses")),
  )
  .all("/responses", methodNotAllowed(["POST"]))
  // A stored response would be the caller's: only a valid key learns that none is kept.
  .all("/responses/:id{.+}", verifyCredential(), (c) => {
    throw notFound(
      `No response '${clipped(c.req.param("id").split("/")[0] ?? "")}' is stored: this gateway keeps no responses, so they cannot be retrieved, cancelled or deleted.`,
      "response_not_found",
      "response_id",
    );
  })
  .post("/embeddings", completionBody("embeddings"), planCompletion(), admitCompletion(), (c) =>
    withModelFallback(c, () => forward(c, "/v1/embeddings")),
  )
  .all("/embeddings", methodNotAllowed(["POST"]));
