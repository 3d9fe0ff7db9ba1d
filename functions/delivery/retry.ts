/**
 * The edge's three retry levels, outermost first (docs/edge.md, "Delivery"). Each level
 * retries only what the level inside it gave up on:
 *
 * 1. model: an alias's next admitted model, when one has no origin that answers
 *    ({@link fallsBack}; run by `model-fallback.ts`);
 * 2. origin: the next candidate, before the first byte reached the client, within
 *    `limits.retry_budget` and the isolate's retry budget ({@link nextAttempt}; run by
 *    `failover.ts`);
 * 3. credential: the origin's next credential when one is refused (401 or 429), at once
 *    within one call (`postBatchWithCredentials`, `contracts/upstream.ts`, the Batcher's too).
 */
import type { Limits } from "../../contracts/config/limits.ts";
import { ApiError } from "../../contracts/errors.ts";
import { RETRY_WINDOW_MS, type RetryBudget } from "./retry-budget.ts";

// The origin failures after which another model may still answer (see errors.ts).
const FALLBACK_CODES = new Set(["no_healthy_origin", "origin_error", "origin_timeout"]);

/** Level 1: whether a failure of one model lets the next model of an alias try. */
export function fallsBack(error: unknown): boolean {
  return error instanceof ApiError && error.code !== null && FALLBACK_CODES.has(error.code);
}

/** Level 2: how many candidates a request may try (`limits.retry_budget` retries at most). */
export function attemptsAllowed(candidates: number, limits: Limits): number {
  return Math.min(candidates, limits.retryBudget + 1);
}

/** Whether attempt `i` may go: `go`, or why the request stops trying other origins. */
export type NextAttempt = "go" | "client_gone" | "timeout" | "budget_spent";

/**
 * Level 2: whether attempt `i` may be made. A client that went away wants no other origin
 * tried; the request timeout bounds every attempt together; a retry spends the isolate's
 * retry budget (`limits.retry_ratio`, `retry_floor`), so an outage cannot become a storm.
 */
export function nextAttempt(
  i: number,
  state: {
    signal: AbortSignal | undefined;
    deadline: number;
    now: number;
    limits: Limits;
    budget: RetryBudget | undefined;
  },
): NextAttempt {
  if (i === 0) return "go";
  if (state.signal?.aborted === true) return "client_gone";
  if (state.now >= state.deadline) return "timeout";
  const { retryRatio: ratio, retryFloor: floor } = state.limits;
  const settings = { ratio, floor, windowMs: RETRY_WINDOW_MS };
  if (state.budget !== undefined && !state.budget.retry(state.now, settings)) {
    return "budget_spent";
  }
  return "go";
}
