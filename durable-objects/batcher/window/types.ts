/**
 * The window policy's data (docs/batching.md, "The window"): its state, which is plain
 * JSON kept in the Batcher's memory, the requests and batches it takes and gives, and its
 * decisions and outcomes.
 */
import type { OriginChooser } from "./origin-choice.ts";
import type { WindowConfig } from "../../../contracts/config/batching.ts";

/** Smallest `retryAfterMs` for a full queue: `retry-after` is whole seconds. */
export const MIN_RETRY_AFTER_MS = 1000;

/** A request handed to the batcher. */
export interface WindowRequest {
  /** The edge's `x-request-id`; unique among queued and in-flight requests. */
  id: string;
  /** Priority lane, 0 highest. */
  lane: number;
  promptTokens: number;
  maxTokens: number;
  /** Absolute ms after which the caller no longer wants it; the lane's timeout caps it. */
  deadline?: number;
  /** When the edge received it (defaults to `now`); the lane timeout counts from here. */
  enqueuedAt?: number;
  /**
   * Origins this request must not go to (they failed it before its first byte). A retry
   * leaves at once, without a window: it has waited once already.
   */
  avoidOrigins?: readonly string[];
  /**
   * The origin the router placed it on: it leaves in that origin's batch, unless that
   * origin is down or cannot hold it when it heads the queue.
   */
  target?: string;
}

/** A request waiting in a lane. */
export interface QueuedRequest {
  id: string;
  lane: number;
  promptTokens: number;
  maxTokens: number;
  enqueuedAt: number;
  /** Absolute ms: past it the lane's `onTimeout` applies. */
  deadline: number;
  /** Absolute ms: its window closes and it leaves as soon as an origin can take it. */
  flushBy: number;
  /** Past its deadline in a lane that keeps waiting (reported once). */
  overdue: boolean;
  /** Origins it must not go to; absent when any will do. */
  avoidOrigins?: string[];
  /** The origin the router placed it on; absent when any will do. */
  target?: string;
}

/** A request sent to an origin and not yet finished. */
export interface InFlightItem {
  id: string;
  lane: number;
  promptTokens: number;
  maxTokens: number;
  batchSeq: number;
  /** When the edge received it: its wait for a first byte counts from here. */
  enqueuedAt: number;
  sentAt: number;
  /** When its first byte came back (`onDispatched`), null before. */
  startedAt: number | null;
  /** A cancel was sent to the origin; it stays here until the origin ends it. */
  cancelled: boolean;
  /** Sent after the origin's last load report, so the report does not count it yet. */
  sinceReport: boolean;
  /**
   * The origin's clock (`t`) on its call's first load report, written as the origin took
   * the call and before its items started: a report written later counts it; none
   * written before does, whichever call brings it (calls are not ordered with each
   * other). Null until that report arrived.
   */
  ackedAt: number | null;
}

/** The part of an origin's last {@link LoadReport} the policy uses, tokens not blocks. */
export interface OriginLoadView {
  receivedAt: number;
  running: number;
  waiting: number;
  maxNumSeqs: number;
  kvFreeTokens: number;
  kvTotalTokens: number;
  /** The engine's reported step time (ms); 0 when it reports none. */
  stepMs: number;
  /** The engine's reported prefill speed (prompt tokens per ms), or null. */
  prefillTokensPerMs: number | null;
  /** Prompt tokens it reported still to prefill, or null. */
  prefillBacklogTokens: number | null;
  /** Prompt tokens looked up in its prefix cache since it started, and those found. */
  prefixQueries: number;
  prefixHits: number;
  /** Batch lines among `running`, and those the origin holds until a slot is free. */
  backgroundRunning: number;
  backgroundQueued: number;
  /** Most batch lines the origin runs at once (its slots less its reserve), or null. */
  backgroundCap: number | null;
}

/** The batcher's view of one origin. */
export interface OriginState {
  id: string;
  report: OriginLoadView | null;
  /** Sequences and prompt tokens sent since the report (net of those already finished). */
  sentSinceReport: number;
  promptTokensSinceReport: number;
  /** Items the report counted that have finished since. */
  doneSinceReport: number;
  inFlight: InFlightItem[];
}

/** An exponentially decaying event count: `value` as of `at`. */
export interface DecayedCount {
  value: number;
  at: number;
}

/** Everything the policy remembers; plain JSON. */
export interface WindowState {
  config: WindowConfig;
  /** One FIFO queue per lane. */
  lanes: QueuedRequest[][];
  origins: OriginState[];
  arrivals: DecayedCount;
  completions: DecayedCount;
  dispatches: DecayedCount;
  /** Waits for a first byte (sum of ms) and how many, for the wait term's mean. */
  firstByteWaitMs: DecayedCount;
  firstBytes: DecayedCount;
  /** How late the batcher's thread ran work it was given (sum of ms) and how often measured. */
  threadLagMs: DecayedCount;
  threadLags: DecayedCount;
  nextBatchSeq: number;
}

/** Why a batch left. */
export type FlushReason = "idle" | "size" | "tokens" | "window";

/** One request inside a batch, in the order the origin should receive it. */
export interface BatchEntry {
  id: string;
  lane: number;
  promptTokens: number;
  maxTokens: number;
}

/** One upstream call to make: the shell builds the wire `batch_id` from `seq`. */
export interface Batch {
  seq: number;
  originId: string;
  reason: FlushReason;
  items: BatchEntry[];
}

/** What `enqueue` decided for the request. */
export type EnqueueDecision =
  /** Nothing was waiting and an origin could start it: sent alone, no added delay. */
  | { kind: "dispatch-now"; batch: Batch }
  /** Waiting; call `tick` at `flushAt` (at once when `flushAt <= now`). */
  | { kind: "queued"; flushAt: number; windowMs: number }
  /** The lane is full: answer 429 with `retry-after`. */
  | { kind: "rejected"; reason: "queue_full"; retryAfterMs: number }
  /** The prompt exceeds the KV cache of every origin; it can never run here. */
  | { kind: "rejected"; reason: "too_large"; capacityTokens: number }
  /** The id is already queued or in flight. */
  | { kind: "rejected"; reason: "duplicate_id" };

/** Something `tick` settled or noticed about a queued request. */
export type TickNotice =
  /** Removed: waited past its deadline in a `reject` lane; retry after the lanes drain. */
  | { kind: "timed-out"; item: QueuedRequest; retryAfterMs: number }
  /** Past its deadline in a `wait` lane: still queued; reported once. */
  | { kind: "overdue"; item: QueuedRequest }
  /** Removed: an origin report showed no origin can ever hold its prompt. */
  | { kind: "too-large"; item: QueuedRequest; capacityTokens: number }
  /** Removed: every origin it may go to is unusable (behind its breaker); another region's may serve it. */
  | { kind: "no-origin"; item: QueuedRequest };

/** What the shell does after a `tick`. */
export interface TickResult {
  state: WindowState;
  /** Upstream calls to make now, one per entry. */
  batches: Batch[];
  notices: TickNotice[];
  /** When to call `tick` next; null when no timer is needed (nothing waits, or waiting on an event). */
  nextWakeAt: number | null;
}

/** Outcome of `cancel`. */
export type CancelOutcome =
  /** It was waiting and is gone; the shell settles it. */
  | { kind: "removed"; item: QueuedRequest }
  /** It is running: the shell sends the origin a cancel for it. */
  | { kind: "cancel-in-flight"; originId: string; batchSeq: number; itemId: string }
  /** A cancel was already sent for it. */
  | { kind: "already-cancelling"; originId: string; batchSeq: number }
  | { kind: "not-found" };

/** Outcome of an in-flight event (`onDispatched`, `onItemDone`). */
export type ItemEventOutcome =
  | { kind: "updated"; item: InFlightItem }
  /** Not in flight at that origin (already finished, or never sent there). */
  | { kind: "not-found" };

/** Outcome of an origin event (`onOriginLoad`). */
export type OriginEventOutcome = { kind: "updated" } | { kind: "unknown-origin" };

/** Hooks that replace parts of the policy; functions, so never part of the state. */
export interface WindowOptions {
  /** Origin choice; defaults to {@link chooseLeastLoaded}. */
  chooseOrigin?: OriginChooser;
  /**
   * Whether an origin may take requests at all, as the origin-health rule says (its
   * breaker); every origin when absent. The window keeps no health state of its own.
   */
  usable?: OriginFilter;
}

/** Whether an origin may take requests. */
export type OriginFilter = (originId: string) => boolean;

/** Options of {@link onDispatched}. */
export interface OnDispatchedOptions {
  /**
   * Count this item's wait in the wait term (default). A caller that reports the waits it
   * observes itself (`recordFirstByteWait`, which include what lies beyond this view)
   * passes false, so its requests are not counted twice.
   */
  countWait?: boolean;
}
