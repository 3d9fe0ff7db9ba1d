/**
 * What a team grants a member key's account, as a pure function (docs/key-account.md,
 * "Teams"): all of what it needs now, or a refusal naming the team limit in the way, plus
 * a share of the team's headroom towards what it would like to hold. The limits and
 * budgets are checked by the key's own code (token-bucket.ts, budgets.ts).
 */
import {
  type BudgetLine,
  CONCURRENCY_RETRY_MS,
  budgetRefusal,
  budgetRoom,
} from "../key-account/budgets.ts";
import { type BucketState, refill, snapshot, take } from "../key-account/token-bucket.ts";
import { LEASE_SHARE, LEASE_SLOT_SHARE } from "../key-account/leases/sizing.ts";
import type { Limits, RateLimitInfo } from "../key-account/types.ts";
import type { TeamAllowance, TeamRefusal } from "./types.ts";

/** The team's state a grant is decided from. */
export interface TeamGrantInput {
  limits: Limits;
  buckets: { requests: BucketState; tokens: BucketState };
  /** The team's budgets with their windows' spend; `reservedPicos` is what member keys hold. */
  lines: BudgetLine[];
  /** Concurrency slots member keys hold. */
  slotsHeld: number;
  need: TeamAllowance | null;
  want: TeamAllowance;
  now: number;
}

/** The grant, and the buckets after it. */
export interface TeamGrantOutcome {
  buckets: { requests: BucketState; tokens: BucketState };
  granted: TeamAllowance;
  refusal: TeamRefusal | null;
}

/** Nothing at all. */
export const NONE: TeamAllowance = { requests: 0, tokens: 0, picos: 0n, slots: 0 };

/** Grants `need` in full or refuses, then tops up towards `want` within a share of headroom. */
export function decideGrant(input: TeamGrantInput): TeamGrantOutcome {
  const { limits, lines, now } = input;
  const need = input.need ?? NONE;
  const buckets = {
    requests: refill(input.buckets.requests, limits.rpm, now),
    tokens: refill(input.buckets.tokens, limits.tpm, now),
  };
  const freeSlots = limits.concurrency - input.slotsHeld;
  const refusal = needRefusal(input, buckets, freeSlots);
  if (refusal !== null) return { buckets, granted: NONE, refusal };

  const room = budgetRoom(lines);
  let picos = need.picos;
  if (room !== null) {
    const left = room - need.picos;
    const share = left > 0n ? left / BigInt(LEASE_SHARE) : 0n;
    const want = input.want.picos - need.picos;
    picos += want <= 0n ? 0n : want < share ? want : share;
  }
  const granted: TeamAllowance = {
    requests:
      need.requests +
      extra(input.want.requests, need.requests, buckets.requests.level, LEASE_SHARE),
    tokens: need.tokens + extra(input.want.tokens, need.tokens, buckets.tokens.level, LEASE_SHARE),
    picos: room === null ? 0n : picos,
    slots: need.slots + extra(input.want.slots, need.slots, freeSlots, LEASE_SLOT_SHARE),
  };
  return {
    buckets: {
      requests: take(buckets.requests, limits.rpm, granted.requests, now).state,
      tokens: take(buckets.tokens, limits.tpm, granted.tokens, now).state,
    },
    granted,
    refusal: null,
  };
}

// What to add beyond what is needed: towards `want`, within a share of what is left.
function extra(want: number, needed: number, left: number, divisor: number): number {
  return Math.min(Math.max(0, want - needed), Math.floor(Math.max(0, left - needed) / divisor));
}

// The team limit `need` does not fit, the one asking for the longest wait; null when it fits.
function needRefusal(
  input: TeamGrantInput,
  buckets: TeamGrantOutcome["buckets"],
  freeSlots: number,
): TeamRefusal | null {
  if (input.need === null) return null;
  const { limits, need, now } = input;
  const rateLimit = rateLimitOf(limits, buckets, now);
  const refusals: TeamRefusal[] = [];
  const rate = (limit: "requests" | "tokens" | "concurrency", value: number, asked: number) => ({
    ok: false as const,
    code: "rate_limit_exceeded" as const,
    limit,
    scope: "team" as const,
    limitValue: value,
    requested: asked,
    rateLimit,
  });
  if (need.slots > 0 && freeSlots < need.slots) {
    refusals.push({
      ...rate("concurrency", limits.concurrency, 1),
      retryAfterMs: CONCURRENCY_RETRY_MS,
      tooLarge: false,
    });
  }
  for (const [limit, capacity, amount, bucket] of [
    ["requests", limits.rpm, need.requests, buckets.requests],
    ["tokens", limits.tpm, need.tokens, buckets.tokens],
  ] as const) {
    const taken = take(bucket, capacity, amount, now).decision;
    if (!taken.ok) {
      const { retryAfterMs, tooLarge } = taken;
      refusals.push({ ...rate(limit, capacity, amount), retryAfterMs, tooLarge });
    }
  }
  const worst = refusals.reduce<TeamRefusal | null>(
    (most, one) =>
      most === null || (one.retryAfterMs ?? Infinity) > (most.retryAfterMs ?? Infinity)
        ? one
        : most,
    null,
  );
  if (worst !== null) return worst;
  const overdraw = budgetRefusal(input.lines, need.picos, now);
  return overdraw === null ? null : { ...overdraw, scope: "team", rateLimit };
}

function rateLimitOf(
  limits: Limits,
  buckets: TeamGrantOutcome["buckets"],
  now: number,
): RateLimitInfo {
  return {
    requests: snapshot(buckets.requests, limits.rpm, now),
    tokens: snapshot(buckets.tokens, limits.tpm, now),
  };
}

/**
 * What other keys may hold that keeps a refused `need` out: money, when the budget's open
 * reservations are in the way (a soon retry may fit), or concurrency slots; null when
 * only time helps (the buckets, a budget's settled spend).
 */
export function heldInTheWay(refusal: TeamRefusal | null): "picos" | "slots" | null {
  if (refusal === null) return null;
  if (refusal.code === "insufficient_quota") {
    const fitsSettled = refusal.spentPicos + refusal.requestedPicos <= refusal.limitPicos;
    return fitsSettled ? "picos" : null;
  }
  return refusal.limit === "concurrency" ? "slots" : null;
}
