/**
 * How large a lease is, as a pure function (docs/key-account.md, "Leased allowances"): two
 * windows of what the isolate used in its last one, never more than a share of what the
 * key has left, and none at all when that share cannot hold a few requests, so that a key
 * near its limits (or with small ones) is admitted exactly, one call a request.
 */
import type { LeaseRate } from "./types.ts";

/** The share of a key's headroom (requests, tokens, money) one grant may take. */
export const LEASE_SHARE = 4;
/** The share of a key's free concurrency slots one grant may take. */
export const LEASE_SLOT_SHARE = 2;
/** No lease smaller than this many requests: below it a key is admitted exactly. */
export const MIN_LEASE_REQUESTS = 4;

/** What a lease holds unused, or what the key has left, in each dimension (null: unlimited). */
export interface Allowance {
  requests: number;
  tokens: number;
  picos: bigint | null;
  slots: number;
}

function share(left: number, divisor: number): number {
  return Math.floor(Math.max(0, left) / divisor);
}

/** What an isolate's rate asks a lease to hold: two windows of it, at least a few requests. */
export function leaseTarget(rate: LeaseRate): Allowance {
  const requests = Math.max(MIN_LEASE_REQUESTS, 2 * rate.requests);
  const per = Math.max(1, rate.requests);
  return {
    requests,
    tokens: Math.ceil((rate.tokens / per) * requests),
    picos: (rate.picos * BigInt(requests) + BigInt(per) - 1n) / BigInt(per),
    slots: Math.max(2, 2 * rate.inFlight),
  };
}

/**
 * What to add to a lease holding `unused` so it holds `target`, within a share of the key's
 * `headroom`; null when the share cannot hold the isolate's typical request or the
 * minimum of requests (then the lease is not topped up).
 */
export function topUp(target: Allowance, unused: Allowance, headroom: Allowance): Allowance | null {
  const requests = Math.min(
    Math.max(0, target.requests - unused.requests),
    share(headroom.requests, LEASE_SHARE),
  );
  const tokens = Math.min(
    Math.max(0, target.tokens - unused.tokens),
    share(headroom.tokens, LEASE_SHARE),
  );
  const slots = Math.min(
    Math.max(0, target.slots - unused.slots),
    share(headroom.slots, LEASE_SLOT_SHARE),
  );
  let picos: bigint | null = null;
  if (headroom.picos !== null) {
    const want = (target.picos ?? 0n) - (unused.picos ?? 0n);
    const room = headroom.picos > 0n ? headroom.picos / BigInt(LEASE_SHARE) : 0n;
    picos = want <= 0n ? 0n : want < room ? want : room;
  }
  // A lease that could not admit a few of the isolate's requests would only fragment the
  // key's headroom: its requests are admitted exactly instead.
  const perRequest = target.tokens / target.requests;
  if (unused.requests + requests < MIN_LEASE_REQUESTS) return null;
  if (unused.tokens + tokens < perRequest * MIN_LEASE_REQUESTS) return null;
  if (picos !== null && target.picos !== null) {
    const perPicos = target.picos / BigInt(target.requests);
    if ((unused.picos ?? 0n) + picos < perPicos * BigInt(MIN_LEASE_REQUESTS)) return null;
  }
  if (unused.slots + slots < 1) return null;
  return { requests, tokens, picos, slots };
}
