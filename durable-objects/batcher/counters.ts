/** The Batcher's counters (docs/batching.md, "Snapshot"), since its incarnation started. */

import type { FlushReason } from "./window/types.ts";
import { emptyHistogram, observe } from "../../contracts/prometheus.ts";
import { type BatcherCounters, QUEUE_WAIT_BOUNDS_MS } from "./types.ts";

export function newCounters(): BatcherCounters {
  return {
    submitted: 0,
    dispatchedAtOnce: 0,
    queued: 0,
    refusedQueueFull: 0,
    refusedOther: 0,
    queueTimeouts: 0,
    queuedNoOrigin: 0,
    cancelledWaiting: 0,
    cancelledRunning: 0,
    failedBeforeHead: 0,
    batches: { idle: 0, size: 0, tokens: 0, window: 0 },
    batchItems: 0,
    batchSizes: {},
    queueWaitMs: emptyHistogram(QUEUE_WAIT_BOUNDS_MS),
    orphansCancelled: 0,
    readPauses: 0,
    holds: 0,
  };
}

/** Counts one upstream call of `size` items that left for `reason`. */
export function countBatch(counters: BatcherCounters, reason: FlushReason, size: number): void {
  counters.batches[reason] += 1;
  counters.batchItems += size;
  const bucket = sizeBucket(size);
  counters.batchSizes[bucket] = (counters.batchSizes[bucket] ?? 0) + 1;
}

/** Counts how long an item waited between its admission and its call leaving, ms. */
export function countQueueWait(counters: BatcherCounters, waitMs: number): void {
  observe(counters.queueWaitMs, QUEUE_WAIT_BOUNDS_MS, waitMs);
}

/** The histogram bucket of a batch size: `1`, `2`, `3-4`, `5-8`, `9-16`, … */
export function sizeBucket(size: number): string {
  if (size <= 2) return String(size);
  let upper = 4;
  while (upper < size) upper *= 2;
  return `${upper / 2 + 1}-${upper}`;
}
