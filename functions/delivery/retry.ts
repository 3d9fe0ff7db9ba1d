/**
 * The edge's three retry levels, outermost first (docs/edge.md, "Delivery"). Each level
 * retries only what the level inside it gave up on:
 *
 * 1. model: an alias's next admitted model, when one has no origin that answers
 *    ({@link fallsBack}; run by `model-fallback.ts`);
 * 2. origin: the next candidate, before the first byte reached the client, within
 *    `limits.retry_budget` and the isolate's retry budget, which a retry into a region the
 *    request has not tried does not spend ({@link nextAttempt}, {@link nextCandidates}; run
 *    by `failover.ts`);
 * 3. credential: the origin's next credential when one is refused (401 or 429), at once
 *    within one call (`postBatchWithCredentials`, `contracts/upstream.ts`, the Batcher's too).
 */
import type { Limits } from "../../contracts/config/limits.ts";
import { ApiError } from "../../contracts/errors.ts";
import { RETRY_WINDOW_MS, type RetryBudget } from "./retry-budget.ts";
import type { RegionOrigin } from "./origin-pool.ts";

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
export type NextAttempt = "go" | "client_gone" | "timeout" | "budget_spent" | "none_left";

/**
 * Level 2: whether attempt `i` may be made. A client that went away wants no other origin
 * tried; the request timeout bounds every attempt together; a retry spends the isolate's
 * retry budget (`limits.retry_ratio`, `retry_floor`), so an outage cannot become a storm,
 * except a retry into a region the request has not tried (`crossRegion`): that is failover,
 * which a region's outage must not run out of, and it happens once a region per request.
 */
export function nextAttempt(
  i: number,
  state: {
    signal: AbortSignal | undefined;
    deadline: number;
    now: number;
    limits: Limits;
    budget: RetryBudget | undefined;
    crossRegion?: boolean;
  },
): NextAttempt {
  if (i === 0) return "go";
  if (state.signal?.aborted === true) return "client_gone";
  if (state.now >= state.deadline) return "timeout";
  if (state.crossRegion === true) return "go";
  const { retryRatio: ratio, retryFloor: floor } = state.limits;
  const settings = { ratio, floor, windowMs: RETRY_WINDOW_MS };
  if (state.budget !== undefined && !state.budget.retry(state.now, settings)) {
    return "budget_spent";
  }
  return "go";
}

/**
 * Level 2: the candidates from attempt `i` on, in the order to try them now. What failed
 * since the request was ranked (its own attempts, or other requests') goes last (`rank`);
 * with the isolate's retry budget spent (`budgetSpent`), a region the request has not tried
 * comes first, so that failover still reaches it; null when none is left.
 */
export function nextCandidates(
  candidates: readonly RegionOrigin[],
  i: number,
  rank: (rest: RegionOrigin[]) => RegionOrigin[],
  budgetSpent: boolean,
): RegionOrigin[] | null {
  const tried = new Set(candidates.slice(0, i).map((candidate) => candidate.region.id));
  let rest = rank(candidates.slice(i));
  if (budgetSpent) rest = rest.filter((candidate) => !tried.has(candidate.region.id));
  return rest.length === 0 ? null : [...candidates.slice(0, i), ...rest];
}

/**
 * The candidates once attempt `i`, planned for `candidates[i]`, ran on `originId` (a
 * region's Batcher places a request by its prefix): that origin's entry takes place `i`,
 * so the one planned stays among those left to try.
 */
export function ranOn(
  candidates: readonly RegionOrigin[],
  i: number,
  originId: string,
): readonly RegionOrigin[] {
  const at = candidates.findIndex((candidate, j) => j > i && candidate.origin.id === originId);
  if (at < 0) return candidates;
  const order = [...candidates];
  [order[i], order[at]] = [order[at] as RegionOrigin, order[i] as RegionOrigin];
  return order;
}

/** Whether attempt `i` goes into a region none of the attempts before it tried. */
export function crossesRegion(candidates: readonly RegionOrigin[], i: number): boolean {
  const region = candidates[i]?.region.id;
  return i > 0 && !candidates.slice(0, i).some((candidate) => candidate.region.id === region);
}
