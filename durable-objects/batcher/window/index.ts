/**
 * The batching policy of the `Batcher` (docs/batching.md, "The window"): priority lanes,
 * the adaptive micro-batching window, KV-memory-aware admission and origin choice. Pure: no
 * I/O, no timers, no clock; time comes in as `now` (ms), decisions go out as values, and no
 * function mutates the state it is given.
 */
export { WINDOW_STATE_VERSION, MIN_RETRY_AFTER_MS } from "./types.ts";
export type {
  WindowRequest,
  QueuedRequest,
  InFlightItem,
  OriginLoadView,
  OriginState,
  DecayedCount,
  WindowState,
  FlushReason,
  BatchEntry,
  Batch,
  EnqueueDecision,
  TickNotice,
  TickResult,
  CancelOutcome,
  ItemEventOutcome,
  OriginEventOutcome,
  WindowOptions,
  OriginFilter,
  OnDispatchedOptions,
} from "./types.ts";
export { createWindowState, queuedCount } from "./state.ts";
export {
  currentWindowMs,
  recordFirstByteWait,
  recordThreadLag,
  MIN_HOLD_MS,
  tokenHoldMs,
  meanThreadLagMs,
  healthyCandidates,
} from "./terms.ts";
export { enqueue, tick } from "./flush.ts";
export { onOriginLoad, onItemsAcked, onDispatched, onItemDone, cancel } from "./events.ts";
