/**
 * Building blocks of the window policy (docs/batching.md): a fresh state, the copy-on-write
 * draft every step works on, lookups, decaying counters and input checks.
 */
import type { LaneConfig, WindowConfig } from "../../../contracts/config/batching.ts";
import {
  type DecayedCount,
  type OriginState,
  type QueuedRequest,
  type WindowRequest,
  type WindowState,
} from "./types.ts";

/** A fresh state: empty lanes, every origin healthy and unreported, window closed. */
export function createWindowState(config: WindowConfig, now: number): WindowState {
  assertTime(now, "now");
  return {
    config: structuredClone(config),
    lanes: config.lanes.map(() => []),
    origins: config.origins.map((o) => ({
      id: o.id,
      report: null,
      sentSinceReport: 0,
      promptTokensSinceReport: 0,
      doneSinceReport: 0,
      inFlight: [],
    })),
    arrivals: { value: 0, at: now },
    completions: { value: 0, at: now },
    dispatches: { value: 0, at: now },
    firstByteWaitMs: { value: 0, at: now },
    firstBytes: { value: 0, at: now },
    threadLagMs: { value: 0, at: now },
    threadLags: { value: 0, at: now },
    nextBatchSeq: 1,
  };
}

/** Requests waiting in all lanes. */
export function queuedCount(state: WindowState): number {
  let total = 0;
  for (const queue of state.lanes) total += queue.length;
  return total;
}

/**
 * A copy whose containers (lanes, origins, in-flight lists) the caller may change. The
 * records inside are shared with `state`, so they are replaced, never edited.
 */
export function draft(state: WindowState): WindowState {
  return {
    ...state,
    lanes: state.lanes.map((queue) => [...queue]),
    origins: state.origins.map((origin) => ({ ...origin, inFlight: [...origin.inFlight] })),
  };
}

export function originById(state: WindowState, id: string): OriginState {
  const origin = state.origins.find((o) => o.id === id);
  if (origin === undefined) throw new Error(`unknown origin ${id}`);
  return origin;
}

export function isKnownId(state: WindowState, id: string): boolean {
  return (
    state.lanes.some((queue) => queue.some((item) => item.id === id)) ||
    state.origins.some((origin) => origin.inFlight.some((item) => item.id === id))
  );
}

export function laneAt(config: WindowConfig, lane: number): LaneConfig {
  const laneConfig = config.lanes[lane];
  if (laneConfig === undefined) throw new RangeError(`lane ${lane} is not configured`);
  return laneConfig;
}

export function laneQueue(state: WindowState, lane: number): QueuedRequest[] {
  const queue = state.lanes[lane];
  if (queue === undefined) throw new RangeError(`lane ${lane} has no queue`);
  return queue;
}

export function decayed(counter: DecayedCount, tauMs: number, now: number): number {
  // A clock that steps backwards decays nothing.
  return counter.value * Math.exp(-Math.max(0, now - counter.at) / tauMs);
}

export function bump(counter: DecayedCount, by: number, tauMs: number, now: number): DecayedCount {
  return { value: decayed(counter, tauMs, now) + by, at: Math.max(now, counter.at) };
}

/** A decaying sum over its decaying count; 0 with fewer than one recent sample, too few to trust. */
export function decayedMean(
  sum: DecayedCount,
  samples: DecayedCount,
  tauMs: number,
  now: number,
): number {
  const n = decayed(samples, tauMs, now);
  return n < 1 ? 0 : decayed(sum, tauMs, now) / n;
}

/** A count from a load report: origins are ours, but a bad number must not poison state. */
export function count(value: number): number {
  return Number.isFinite(value) && value > 0 ? value : 0;
}

export function assertTime(value: number, name: string): void {
  if (!Number.isFinite(value)) throw new RangeError(`${name} must be a finite time, got ${value}`);
}

export function assertRequest(config: WindowConfig, req: WindowRequest): void {
  if (req.id.length === 0) throw new RangeError("request id is empty");
  laneAt(config, req.lane);
  for (const [name, value] of [
    ["promptTokens", req.promptTokens],
    ["maxTokens", req.maxTokens],
  ] as const) {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw new RangeError(`${name} must be a non-negative integer, got ${value}`);
    }
  }
  if (req.deadline !== undefined) assertTime(req.deadline, "deadline");
  if (req.enqueuedAt !== undefined) assertTime(req.enqueuedAt, "enqueuedAt");
}

/** Fails on a case an exhaustive `switch` missed: a bug, never an expected failure. */
export function assertNever(value: never): never {
  throw new Error(`unhandled case ${JSON.stringify(value)}`);
}
