/**
 * What `Batcher.snapshot` answers (docs/batching.md, "Inside the Batcher"): counters, the window's
 * current view of its lanes and origins, routing, and the calls open and persisted.
 */
import type { LiveWindow } from "./live-window.ts";
import type { BatcherCounters, BatcherSnapshot } from "./types.ts";
import type { Calls } from "./upstream/calls.ts";
import { currentWindowMs, meanThreadLagMs, tokenHoldMs } from "./window/terms.ts";

/** The Batcher's view now. */
export function snapshotOf(
  window: LiveWindow,
  calls: Calls,
  persistedBatches: number,
  counters: BatcherCounters,
): BatcherSnapshot {
  const now = Date.now();
  const state = window.state;
  const inFlight: Record<string, number> = {};
  const origins: BatcherSnapshot["origins"] = {};
  for (const origin of state?.origins ?? []) {
    inFlight[origin.id] = origin.inFlight.length;
    const { report } = origin;
    origins[origin.id] = report === null ? null : { ...report, ageMs: now - report.receivedAt };
  }
  return {
    version: window.setup?.version ?? null,
    queued: window.queued(),
    lanes: state?.lanes.map((lane) => lane.length) ?? [],
    windowMs: state === null ? 0 : currentWindowMs(state, now, window.options.usable),
    threadLagMs: state === null ? 0 : meanThreadLagMs(state, now),
    holdMs: state === null ? 0 : tokenHoldMs(state, now),
    inFlight,
    origins,
    routing: window.router?.view() ?? null,
    openBatches: calls.size,
    persistedBatches,
    counters: structuredClone(counters),
    recentBatches: structuredClone(calls.recent),
  };
}
