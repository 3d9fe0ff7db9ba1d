// A per-minute token bucket: `capacity` units, refilled linearly so that an empty
// bucket is full again after one minute. Pure: time comes in as `now` (ms).
// The level may go below zero when real usage exceeds a reservation (debt);
// it then refills from the debt like any other level.
// See docs/key-account.md.

import type { BucketSnapshot } from "./types.ts";

/** Milliseconds over which an empty bucket refills completely. */
export const BUCKET_WINDOW_MS = 60_000;

/** A bucket's stored state: its level and the time it was last brought up to date. */
export interface BucketState {
  level: number;
  updatedAt: number;
}

/** The outcome of taking units from a bucket. */
export type TakeDecision =
  | { ok: true }
  | {
      ok: false;
      retryAfterMs: number;
      /** The request can never fit this bucket. */ tooLarge: boolean;
    };

/** A full bucket as of `now`: the state of a bucket that has never been used. */
export function fullBucket(capacity: number, now: number): BucketState {
  return { level: capacity, updatedAt: now };
}

/** Brings a bucket up to `now`; a clock that steps backwards adds nothing. */
export function refill(state: BucketState, capacity: number, now: number): BucketState {
  const elapsed = Math.max(0, now - state.updatedAt);
  const level = Math.min(capacity, state.level + (elapsed * capacity) / BUCKET_WINDOW_MS);
  return { level, updatedAt: Math.max(now, state.updatedAt) };
}

/** Milliseconds until the bucket holds `amount` units, 0 when it already does. */
export function msUntil(state: BucketState, capacity: number, amount: number): number {
  if (state.level >= amount) return 0;
  return Math.ceil(((amount - state.level) * BUCKET_WINDOW_MS) / capacity);
}

/** Takes `amount` units when the bucket holds them; otherwise says when to retry. */
export function take(
  state: BucketState,
  capacity: number,
  amount: number,
  now: number,
): { state: BucketState; decision: TakeDecision } {
  const current = refill(state, capacity, now);
  if (current.level >= amount) {
    return { state: { ...current, level: current.level - amount }, decision: { ok: true } };
  }
  const tooLarge = amount > capacity;
  // A request larger than the bucket never fits; the honest hint is a full refill.
  const retryAfterMs = msUntil(current, capacity, tooLarge ? capacity : amount);
  return { state: current, decision: { ok: false, retryAfterMs, tooLarge } };
}

/** Adds `delta` units (a refund when positive, a charge when negative), never above capacity. */
export function adjust(
  state: BucketState,
  capacity: number,
  delta: number,
  now: number,
): BucketState {
  const current = refill(state, capacity, now);
  return { ...current, level: Math.min(capacity, current.level + delta) };
}

/** Reports limit, whole remaining units and time to full, as of `now`. */
export function snapshot(state: BucketState, capacity: number, now: number): BucketSnapshot {
  const current = refill(state, capacity, now);
  return {
    limit: capacity,
    remaining: Math.max(0, Math.floor(current.level)),
    resetMs: msUntil(current, capacity, capacity),
  };
}
