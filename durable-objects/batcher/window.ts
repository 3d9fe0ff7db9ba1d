// The batching policy of the `Batcher` Durable Object (one per region+model[+shard]):
// priority lanes, the adaptive micro-batching window, KV-memory-aware admission and
// origin choice. Pure: no I/O, no timers, no clock. Time comes in as `now` (ms),
// decisions go out as values, and the state is plain JSON so the shell can keep it in
// Durable Object SQLite and rebuild it after eviction.
//
// Lifecycle of a request id: `enqueue` → dispatched at once, queued or rejected. A queued
// id leaves through `tick` in exactly one way: in a batch, timed out, too large for every
// origin, or removed by `cancel`. A dispatched id stays in its origin's in-flight list
// until `onItemDone`. Functions never mutate the state they are given: they copy its
// containers and replace, never edit, the queued and in-flight records they change, so an
// event costs a copy of the id lists rather than of every record.
//
// When requests wait: never while nothing else waits and the chosen origin is idle. Under
// load the window is the largest of three terms, each bounded by `maxWindowMs`:
// - overload: arrivals outpace what the origins can start (free slots plus completions);
// - calls: arrivals outpace the calls worth making (one per engine step per healthy
//   origin, as its load reports tell, and never more than one per `callIntervalMs`),
//   which collapses many requests into few calls while the engines still have free slots
//   (with a large `max_num_seqs` the overload term stays 0);
// - wait: a share (`waitShare`) of how long requests have recently waited for their first
//   byte, from arrival, as this batcher saw it and as callers report it
//   (`recordFirstByteWait`; decaying mean over `rateWindowMs`), or of how late the
//   batcher's own thread runs the work it is given (`recordThreadLag`), whichever is
//   longer. When requests wait long anyway, whatever the cause (engines, network, the edge
//   itself, a saturated batcher), a window that adds a small share of that wait costs
//   little and saves many calls, each of which the batcher's thread pays for; when they
//   come fast, it stays near 0.

import type { LoadReport } from "../../contracts/protocol.ts";
import { chooseLeastLoaded } from "./origin-choice.ts";
import type { LaneConfig, WindowConfig } from "./settings.ts";
import type { OriginCandidate, OriginChooser } from "./origin-choice.ts";

/** Version of the persisted {@link WindowState} shape. */
export const WINDOW_STATE_VERSION = 2;
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
}

/** The batcher's view of one origin. */
export interface OriginState {
  id: string;
  /** Skipped until this time (ms); null when healthy. */
  downUntil: number | null;
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
  v: typeof WINDOW_STATE_VERSION;
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
  /** Removed: waited past its deadline in a `reject` lane. */
  | { kind: "timed-out"; item: QueuedRequest }
  /** Past its deadline in a `wait` lane: still queued; reported once. */
  | { kind: "overdue"; item: QueuedRequest }
  /** Removed: an origin report showed no origin can ever hold its prompt. */
  | { kind: "too-large"; item: QueuedRequest; capacityTokens: number };

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

/** Outcome of an origin event (`onOriginLoad`, `markOriginDown`). */
export type OriginEventOutcome = { kind: "updated" } | { kind: "unknown-origin" };

/** Hooks that replace parts of the policy; functions, so never part of the state. */
export interface WindowOptions {
  /** Origin choice; defaults to {@link chooseLeastLoaded}. */
  chooseOrigin?: OriginChooser;
}

/** A fresh state: empty lanes, every origin healthy and unreported, window closed. */
export function createWindowState(config: WindowConfig, now: number): WindowState {
  assertTime(now, "now");
  return {
    v: WINDOW_STATE_VERSION,
    config: structuredClone(config),
    lanes: config.lanes.map(() => []),
    origins: config.origins.map((o) => ({
      id: o.id,
      downUntil: null,
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

/** Admits a request: sends it at once, queues it behind the window, or refuses it. */
export function enqueue(
  state: WindowState,
  req: WindowRequest,
  now: number,
  options: WindowOptions = {},
): { state: WindowState; decision: EnqueueDecision } {
  assertTime(now, "now");
  assertRequest(state.config, req);
  if (isKnownId(state, req.id)) {
    return { state, decision: { kind: "rejected", reason: "duplicate_id" } };
  }
  const capacityTokens = kvCapacityBound(state);
  if (capacityTokens !== null && req.promptTokens > capacityTokens) {
    return { state, decision: { kind: "rejected", reason: "too_large", capacityTokens } };
  }
  const laneConfig = laneAt(state.config, req.lane);
  const queue = laneQueue(state, req.lane);
  if (queue.length >= laneConfig.maxQueue) {
    const retryAfterMs = estimateRetryAfterMs(state, queue.length, laneConfig, now);
    return { state, decision: { kind: "rejected", reason: "queue_full", retryAfterMs } };
  }

  const next = draft(state);
  next.arrivals = bump(next.arrivals, 1, next.config.rateWindowMs, now);
  const windowMs = currentWindowMs(next, now);
  const enqueuedAt = req.enqueuedAt ?? now;
  const deadline = Math.min(req.deadline ?? Infinity, enqueuedAt + laneConfig.queueTimeoutMs);
  const avoid = req.avoidOrigins ?? [];
  const item: QueuedRequest = {
    id: req.id,
    lane: req.lane,
    promptTokens: req.promptTokens,
    maxTokens: req.maxTokens,
    enqueuedAt,
    deadline,
    flushBy: avoid.length > 0 ? now : Math.min(deadline, now + windowMs),
    overdue: false,
    ...(avoid.length > 0 && { avoidOrigins: [...avoid] }),
  };

  if (queuedCount(next) === 0 && deadline > now) {
    // A lone request never waits for a window that nobody else will join: when the
    // origins keep up (window 0) or the chosen origin is idle, it leaves now.
    const candidates = allowedCandidates(healthyCandidates(next, now), item);
    const originId = (options.chooseOrigin ?? chooseLeastLoaded)(candidates, item);
    if (originId !== null) {
      const candidate = candidateById(candidates, originId);
      if (
        windowMs === 0 ||
        avoid.length > 0 ||
        (candidate.load === 0 && candidate.inFlight === 0)
      ) {
        const batch = sendBatch(next, originId, [item], "idle", now);
        return { state: next, decision: { kind: "dispatch-now", batch } };
      }
    }
  }

  laneQueue(next, req.lane).push(item);
  return { state: next, decision: { kind: "queued", flushAt: flushAt(next, now), windowMs } };
}

/**
 * Applies queue timeouts, then flushes every batch that is due and fits an origin.
 * Call it at `nextWakeAt`, after a `queued` decision that is due, and after any event
 * that frees capacity (`onItemDone`, `onOriginLoad`, an origin coming back).
 */
export function tick(state: WindowState, now: number, options: WindowOptions = {}): TickResult {
  assertTime(now, "now");
  const next = draft(state);
  const notices: TickNotice[] = [];

  for (const [lane, queue] of next.lanes.entries()) {
    const laneConfig = laneAt(next.config, lane);
    const kept: QueuedRequest[] = [];
    for (const item of queue) {
      if (item.overdue || item.deadline > now) {
        kept.push(item);
        continue;
      }
      switch (laneConfig.onTimeout) {
        case "reject":
          notices.push({ kind: "timed-out", item });
          break;
        case "wait": {
          const overdue = { ...item, overdue: true };
          kept.push(overdue);
          notices.push({ kind: "overdue", item: { ...overdue } });
          break;
        }
        default:
          assertNever(laneConfig.onTimeout);
      }
    }
    next.lanes[lane] = kept;
  }

  const capacityTokens = kvCapacityBound(next);
  if (capacityTokens !== null) {
    for (const [lane, queue] of next.lanes.entries()) {
      next.lanes[lane] = queue.filter((item) => {
        if (item.promptTokens <= capacityTokens) return true;
        notices.push({ kind: "too-large", item, capacityTokens });
        return false;
      });
    }
  }

  const batches = flushDue(next, now, options.chooseOrigin ?? chooseLeastLoaded);
  return { state: next, batches, notices, nextWakeAt: nextWakeAt(next, now) };
}

/** Takes in a load report piggybacked on a batch response; it replaces the previous one. */
export function onOriginLoad(
  state: WindowState,
  originId: string,
  report: LoadReport,
  now: number,
): { state: WindowState; outcome: OriginEventOutcome } {
  assertTime(now, "now");
  if (!state.origins.some((o) => o.id === originId)) {
    return { state, outcome: { kind: "unknown-origin" } };
  }
  const next = draft(state);
  const origin = originById(next, originId);
  const blockSize = count(report.block_size);
  origin.report = {
    receivedAt: now,
    running: count(report.running),
    waiting: count(report.waiting),
    maxNumSeqs: count(report.max_num_seqs),
    kvFreeTokens: count(report.kv_free_blocks) * blockSize,
    kvTotalTokens: count(report.kv_total_blocks) * blockSize,
    stepMs: stepMsOf(report.step_ms),
  };
  // The report already counts what we sent before it arrived; a report written just
  // before a send can undercount by that batch until the next report (one per response).
  origin.sentSinceReport = 0;
  origin.promptTokensSinceReport = 0;
  origin.doneSinceReport = 0;
  origin.inFlight = origin.inFlight.map((item) =>
    item.sinceReport ? { ...item, sinceReport: false } : item,
  );
  return { state: next, outcome: { kind: "updated" } };
}

/**
 * Counts a wait for a first byte that a caller observed (from its own start to the first
 * byte it received), so the wait term also sees delays beyond this batcher's view.
 */
export function recordFirstByteWait(state: WindowState, waitMs: number, now: number): WindowState {
  assertTime(now, "now");
  if (!Number.isFinite(waitMs) || waitMs < 0) return state;
  const { rateWindowMs } = state.config;
  return {
    ...state,
    firstByteWaitMs: bump(state.firstByteWaitMs, waitMs, rateWindowMs, now),
    firstBytes: bump(state.firstBytes, 1, rateWindowMs, now),
  };
}

/**
 * Counts how late the batcher's thread ran a piece of work it was given (a timer firing
 * `lagMs` late): when the thread is saturated, every request waits about that long for it
 * anyway, so the wait term may add a share of it, and {@link tokenHoldMs} holds tokens for
 * a share of it.
 */
export function recordThreadLag(state: WindowState, lagMs: number, now: number): WindowState {
  assertTime(now, "now");
  if (!Number.isFinite(lagMs) || lagMs < 0) return state;
  const { rateWindowMs } = state.config;
  return {
    ...state,
    threadLagMs: bump(state.threadLagMs, lagMs, rateWindowMs, now),
    threadLags: bump(state.threadLags, 1, rateWindowMs, now),
  };
}

/** Shortest hold worth a timer, ms: below it {@link tokenHoldMs} is 0. */
export const MIN_HOLD_MS = 1;

/**
 * How long a streamed item's later tokens may be held now so that several origin chunks
 * leave in one write: `holdShare` of the thread's recent mean lag, at most `maxHoldMs`, and
 * 0 below {@link MIN_HOLD_MS}. A thread that keeps up has no lag, and nothing is held; a
 * saturated one already delays every chunk by about its lag and pays per write, so joining
 * writes for a share of that lag buys back the time it is short of.
 */
export function tokenHoldMs(state: WindowState, now: number): number {
  const { holdShare, maxHoldMs } = state.config;
  const holdMs = Math.min(maxHoldMs, holdShare * meanThreadLagMs(state, now));
  return holdMs >= MIN_HOLD_MS ? holdMs : 0;
}

/** The recent mean lag of the batcher's thread ({@link recordThreadLag}); 0 without one. */
export function meanThreadLagMs(state: WindowState, now: number): number {
  return decayedMean(state.threadLagMs, state.threadLags, state.config.rateWindowMs, now);
}

/** Options of {@link onDispatched}. */
export interface OnDispatchedOptions {
  /**
   * Count this item's wait in the wait term (default). A caller that reports the waits it
   * observes itself (`recordFirstByteWait`, which include what lies beyond this view)
   * passes false, so its requests are not counted twice.
   */
  countWait?: boolean;
}

/** Records that an in-flight item's first byte came back (it no longer waits). */
export function onDispatched(
  state: WindowState,
  originId: string,
  itemId: string,
  now: number,
  options: OnDispatchedOptions = {},
): { state: WindowState; outcome: ItemEventOutcome } {
  assertTime(now, "now");
  const index =
    state.origins.find((o) => o.id === originId)?.inFlight.findIndex((i) => i.id === itemId) ?? -1;
  if (index < 0) return { state, outcome: { kind: "not-found" } };
  const next = draft(state);
  const origin = originById(next, originId);
  const found = origin.inFlight[index];
  if (found === undefined) throw new Error(`in-flight item ${itemId} vanished`);
  const item = { ...found, startedAt: found.startedAt ?? now };
  origin.inFlight[index] = item;
  if (found.startedAt === null && options.countWait !== false) {
    const { rateWindowMs } = next.config;
    const waited = Math.max(0, now - found.enqueuedAt);
    next.firstByteWaitMs = bump(next.firstByteWaitMs, waited, rateWindowMs, now);
    next.firstBytes = bump(next.firstBytes, 1, rateWindowMs, now);
  }
  return { state: next, outcome: { kind: "updated", item: { ...item } } };
}

/** Records that an in-flight item ended (any outcome): frees its slot and KV accounting. */
export function onItemDone(
  state: WindowState,
  originId: string,
  itemId: string,
  now: number,
): { state: WindowState; outcome: ItemEventOutcome } {
  assertTime(now, "now");
  const index =
    state.origins.find((o) => o.id === originId)?.inFlight.findIndex((i) => i.id === itemId) ?? -1;
  if (index < 0) return { state, outcome: { kind: "not-found" } };
  const next = draft(state);
  const origin = originById(next, originId);
  const [item] = origin.inFlight.splice(index, 1);
  if (item === undefined) throw new Error(`in-flight item ${itemId} vanished`);
  if (item.sinceReport) {
    // Its prompt blocks are free or evictable again (vLLM counts both as free), so the
    // tokens we subtracted from the report come back; earlier items wait for a report.
    origin.sentSinceReport -= 1;
    origin.promptTokensSinceReport -= item.promptTokens;
  } else {
    origin.doneSinceReport += 1;
  }
  next.completions = bump(next.completions, 1, next.config.rateWindowMs, now);
  return { state: next, outcome: { kind: "updated", item } };
}

/** Cancels a request: removes it when waiting, or says where to send the origin cancel. */
export function cancel(
  state: WindowState,
  id: string,
  now: number,
): { state: WindowState; outcome: CancelOutcome } {
  assertTime(now, "now");
  for (const [lane, queue] of state.lanes.entries()) {
    const index = queue.findIndex((item) => item.id === id);
    if (index < 0) continue;
    const next = draft(state);
    const [item] = laneQueue(next, lane).splice(index, 1);
    if (item === undefined) throw new Error(`queued item ${id} vanished`);
    return { state: next, outcome: { kind: "removed", item } };
  }
  for (const [o, origin] of state.origins.entries()) {
    const index = origin.inFlight.findIndex((item) => item.id === id);
    const found = origin.inFlight[index];
    if (found === undefined) continue;
    if (found.cancelled) {
      return {
        state,
        outcome: { kind: "already-cancelling", originId: origin.id, batchSeq: found.batchSeq },
      };
    }
    const next = draft(state);
    const inFlight = next.origins[o]?.inFlight;
    if (inFlight === undefined) throw new Error(`origin ${origin.id} vanished`);
    const item = { ...found, cancelled: true };
    inFlight[index] = item;
    return {
      state: next,
      outcome: {
        kind: "cancel-in-flight",
        originId: origin.id,
        batchSeq: item.batchSeq,
        itemId: id,
      },
    };
  }
  return { state, outcome: { kind: "not-found" } };
}

/** Skips an origin until `until` (ms); pass the current time to bring it back. */
export function markOriginDown(
  state: WindowState,
  originId: string,
  until: number,
): { state: WindowState; outcome: OriginEventOutcome } {
  assertTime(until, "until");
  if (!state.origins.some((o) => o.id === originId)) {
    return { state, outcome: { kind: "unknown-origin" } };
  }
  const next = draft(state);
  originById(next, originId).downUntil = until;
  return { state: next, outcome: { kind: "updated" } };
}

/**
 * The window a request arriving now would wait, in ms: the largest of the overload, call
 * and wait terms (see the top of this file), at most `maxWindowMs`. 0 while the origins
 * keep up with all three.
 */
export function currentWindowMs(state: WindowState, now: number): number {
  const candidates = healthyCandidates(state, now);
  return Math.max(
    overloadWindowMs(state, candidates, now),
    callWindowMs(state, candidates, now),
    waitWindowMs(state, now),
  );
}

/**
 * `waitShare` of the recent mean wait for a first byte or of the thread's recent mean lag,
 * whichever is longer; 0 until either has been measured (a lone request at start-up has
 * nothing to go by and is not held).
 */
function waitWindowMs(state: WindowState, now: number): number {
  const { waitShare, maxWindowMs, rateWindowMs } = state.config;
  if (waitShare <= 0) return 0;
  const firstByteMs = decayedMean(state.firstByteWaitMs, state.firstBytes, rateWindowMs, now);
  return Math.min(maxWindowMs, waitShare * Math.max(firstByteMs, meanThreadLagMs(state, now)));
}

/** A decaying sum over its decaying count; 0 with fewer than one recent sample, too few to trust. */
function decayedMean(sum: DecayedCount, samples: DecayedCount, tauMs: number, now: number): number {
  const n = decayed(samples, tauMs, now);
  return n < 1 ? 0 : decayed(sum, tauMs, now) / n;
}

/**
 * Grows with the overload ratio (arrivals over what the origins can start: free slots plus
 * recent completions, both per `rateWindowMs`), up to `maxWindowMs`.
 */
function overloadWindowMs(
  state: WindowState,
  candidates: readonly OriginCandidate[],
  now: number,
): number {
  const { maxWindowMs, rateWindowMs } = state.config;
  const arrivals = decayed(state.arrivals, rateWindowMs, now);
  let startable = decayed(state.completions, rateWindowMs, now);
  for (const candidate of candidates) {
    // An origin that never reported is taken to start a whole batch, as Triton assumes
    // of an idle model instance; its first response brings the truth.
    startable += candidate.freeSlots ?? state.config.maxBatchSize;
  }
  if (arrivals <= startable) return 0;
  // Holding requests costs little once the engines queue them anyway (vLLM only admits
  // new sequences at step boundaries and while slots and KV blocks last).
  if (startable <= 0) return maxWindowMs;
  return Math.min(maxWindowMs, maxWindowMs * (arrivals / startable - 1));
}

/**
 * 0 while arrivals stay under the useful call rate: one call per origin per its engine's
 * reported step time, or per `callIntervalMs` when that is longer or the engine reports
 * none (an engine starts new sequences only at step boundaries, so more frequent calls
 * only cost). Above that, each request waits `1/callRate - 1/arrivalRate`: a flush then
 * leaves about every `1/callRate` ms (the window plus the wait for the next arrival that
 * opens one), so calls stay at the useful rate and each carries about
 * `arrivalRate/callRate` requests. The term is 0 at the threshold and rises smoothly
 * towards `1/callRate`.
 */
function callWindowMs(
  state: WindowState,
  candidates: readonly OriginCandidate[],
  now: number,
): number {
  const { callIntervalMs, maxWindowMs, rateWindowMs } = state.config;
  if (callIntervalMs <= 0 || candidates.length === 0) return 0;
  const arrivalsPerMs = decayed(state.arrivals, rateWindowMs, now) / rateWindowMs;
  let callsPerMs = 0;
  for (const candidate of candidates) {
    const stepMs = originById(state, candidate.id).report?.stepMs ?? 0;
    callsPerMs += 1 / Math.max(callIntervalMs, stepMs);
  }
  if (arrivalsPerMs <= callsPerMs) return 0;
  return Math.min(maxWindowMs, 1 / callsPerMs - 1 / arrivalsPerMs);
}

// A reported step time in ms: a finite positive number, else 0 (unknown).
function stepMsOf(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) && value > 0 ? value : 0;
}

/** The origins the policy may send to now, as the origin chooser sees them. */
export function healthyCandidates(state: WindowState, now: number): OriginCandidate[] {
  const candidates: OriginCandidate[] = [];
  for (const origin of state.origins) {
    if (origin.downUntil !== null && origin.downUntil > now) continue;
    candidates.push(candidateOf(origin, state.config, now));
  }
  return candidates;
}

/** Requests waiting in all lanes. */
export function queuedCount(state: WindowState): number {
  let total = 0;
  for (const queue of state.lanes) total += queue.length;
  return total;
}

function candidateOf(origin: OriginState, config: WindowConfig, now: number): OriginCandidate {
  const inFlight = origin.inFlight.length;
  const report = origin.report;
  // With nothing of ours in flight no response will bring a fresher report, so an old
  // one that says "full" would hold requests back forever; past the TTL we probe instead.
  const trusted =
    report !== null && (inFlight > 0 || now - report.receivedAt < config.loadReportTtlMs);
  if (!trusted)
    return { id: origin.id, load: inFlight, freeSlots: null, kvRoomTokens: null, inFlight };
  const load = Math.max(
    0,
    report.running + report.waiting + origin.sentSinceReport - origin.doneSinceReport,
  );
  // Sequences already waiting mean the engine is not starting more right now.
  const freeSlots = report.waiting > 0 ? 0 : Math.max(0, report.maxNumSeqs - load);
  const kvRoomTokens = Math.max(0, report.kvFreeTokens - origin.promptTokensSinceReport);
  return { id: origin.id, load, freeSlots, kvRoomTokens, inFlight };
}

function candidateById(candidates: readonly OriginCandidate[], id: string): OriginCandidate {
  const candidate = candidates.find((c) => c.id === id);
  if (candidate === undefined) throw new Error(`origin chooser returned unknown origin ${id}`);
  return candidate;
}

/** Whether a flush is due now, and why; null when every window is still open. */
function dueReason(state: WindowState, now: number): Exclude<FlushReason, "idle"> | null {
  let items = 0;
  let tokens = 0;
  let windowClosed = false;
  for (const queue of state.lanes) {
    for (const item of queue) {
      items += 1;
      tokens += item.promptTokens + item.maxTokens;
      if (item.flushBy <= now) windowClosed = true;
    }
  }
  if (items >= state.config.maxBatchSize) return "size";
  if (tokens >= state.config.maxBatchTokens) return "tokens";
  return windowClosed ? "window" : null;
}

function flushAt(state: WindowState, now: number): number {
  if (dueReason(state, now) !== null) return now;
  return earliestFlushBy(state) ?? now;
}

function earliestFlushBy(state: WindowState): number | null {
  let earliest: number | null = null;
  for (const queue of state.lanes) {
    for (const item of queue) {
      if (earliest === null || item.flushBy < earliest) earliest = item.flushBy;
    }
  }
  return earliest;
}

function flushDue(state: WindowState, now: number, choose: OriginChooser): Batch[] {
  const batches: Batch[] = [];
  for (;;) {
    const reason = dueReason(state, now);
    if (reason === null) return batches;
    const candidates = healthyCandidates(state, now);
    // The head is the first request some healthy origin may take: one that avoids every
    // healthy origin waits for another to come back without holding up the rest.
    const head = firstPlaceable(state, candidates);
    if (head === null) return batches;
    const originId = choose(allowedCandidates(candidates, head), head);
    if (originId === null) return batches;
    const taken = fillBatch(state, candidateById(candidates, originId));
    if (taken.length === 0) {
      throw new Error(`origin chooser picked ${originId}, which cannot hold ${head.id}`);
    }
    const leaving = new Set(taken.map((item) => item.id));
    for (const [lane, queue] of state.lanes.entries()) {
      state.lanes[lane] = queue.filter((item) => !leaving.has(item.id));
    }
    batches.push(sendBatch(state, originId, taken, reason, now));
  }
}

/**
 * Fills one batch for `origin`: lanes in priority order, FIFO within a lane, up to the
 * size and token limits and the origin's KV room. Stops at the first request that does
 * not fit rather than letting later ones overtake it, as vLLM's FCFS scheduler does, so
 * a long prompt is delayed but never starved; it may still go to another origin. A
 * request that avoids this origin is passed over: it is not short of room, it may only
 * go elsewhere.
 */
function fillBatch(state: WindowState, origin: OriginCandidate): QueuedRequest[] {
  const { maxBatchSize, maxBatchTokens } = state.config;
  const taken: QueuedRequest[] = [];
  let tokens = 0;
  let kvRoom = origin.kvRoomTokens;
  for (const queue of state.lanes) {
    for (const item of queue) {
      if (item.avoidOrigins?.includes(origin.id) === true) continue;
      const itemTokens = item.promptTokens + item.maxTokens;
      if (taken.length >= maxBatchSize) return taken;
      if (taken.length > 0 && tokens + itemTokens > maxBatchTokens) return taken;
      if (kvRoom !== null && item.promptTokens > kvRoom) return taken;
      taken.push(item);
      tokens += itemTokens;
      if (kvRoom !== null) kvRoom -= item.promptTokens;
    }
  }
  return taken;
}

function sendBatch(
  state: WindowState,
  originId: string,
  items: readonly QueuedRequest[],
  reason: FlushReason,
  now: number,
): Batch {
  const origin = state.origins.find((o) => o.id === originId);
  if (origin === undefined) throw new Error(`unknown origin ${originId}`);
  const seq = state.nextBatchSeq;
  state.nextBatchSeq += 1;
  for (const item of items) {
    origin.inFlight.push({
      id: item.id,
      lane: item.lane,
      promptTokens: item.promptTokens,
      maxTokens: item.maxTokens,
      batchSeq: seq,
      enqueuedAt: item.enqueuedAt,
      sentAt: now,
      startedAt: null,
      cancelled: false,
      sinceReport: true,
    });
    origin.sentSinceReport += 1;
    origin.promptTokensSinceReport += item.promptTokens;
  }
  state.dispatches = bump(state.dispatches, items.length, state.config.rateWindowMs, now);
  return {
    seq,
    originId,
    reason,
    items: items.map(({ id, lane, promptTokens, maxTokens }) => ({
      id,
      lane,
      promptTokens,
      maxTokens,
    })),
  };
}

function nextWakeAt(state: WindowState, now: number): number | null {
  if (queuedCount(state) === 0) return null;
  let wake: number | null = null;
  const consider = (at: number): void => {
    if (at > now && (wake === null || at < wake)) wake = at;
  };
  for (const queue of state.lanes) {
    for (const item of queue) if (!item.overdue) consider(item.deadline);
  }
  if (dueReason(state, now) === null) {
    const flushBy = earliestFlushBy(state);
    if (flushBy !== null) consider(flushBy);
  } else {
    // Due but no origin can take the head: wake when an origin returns or its untrusted
    // report expires; completions and reports arrive as events and call `tick` anyway.
    for (const origin of state.origins) {
      if (origin.downUntil !== null) consider(origin.downUntil);
      if (origin.report !== null && origin.inFlight.length === 0) {
        consider(origin.report.receivedAt + state.config.loadReportTtlMs);
      }
    }
  }
  return wake;
}

/** Largest prompt any origin could ever hold, once every origin has reported; else null. */
function kvCapacityBound(state: WindowState): number | null {
  let bound = 0;
  for (const origin of state.origins) {
    if (origin.report === null || origin.report.kvTotalTokens === 0) return null;
    bound = Math.max(bound, origin.report.kvTotalTokens);
  }
  return bound;
}

function estimateRetryAfterMs(
  state: WindowState,
  ahead: number,
  lane: LaneConfig,
  now: number,
): number {
  const drainedPerMs =
    decayed(state.dispatches, state.config.rateWindowMs, now) / state.config.rateWindowMs;
  const drainMs = drainedPerMs > 0 ? Math.ceil(ahead / drainedPerMs) : lane.queueTimeoutMs;
  return Math.max(MIN_RETRY_AFTER_MS, Math.min(drainMs, lane.queueTimeoutMs));
}

function firstPlaceable(
  state: WindowState,
  candidates: readonly OriginCandidate[],
): QueuedRequest | null {
  for (const queue of state.lanes) {
    for (const item of queue) {
      if (allowedCandidates(candidates, item).length > 0) return item;
    }
  }
  return null;
}

/** The candidates a request may go to (all of them unless it avoids some). */
function allowedCandidates(
  candidates: readonly OriginCandidate[],
  item: { avoidOrigins?: readonly string[] },
): readonly OriginCandidate[] {
  const avoid = item.avoidOrigins;
  if (avoid === undefined || avoid.length === 0) return candidates;
  return candidates.filter((candidate) => !avoid.includes(candidate.id));
}

/**
 * A copy whose containers (lanes, origins, in-flight lists) the caller may change. The
 * records inside are shared with `state`, so they are replaced, never edited.
 */
function draft(state: WindowState): WindowState {
  return {
    ...state,
    lanes: state.lanes.map((queue) => [...queue]),
    origins: state.origins.map((origin) => ({ ...origin, inFlight: [...origin.inFlight] })),
  };
}

function originById(state: WindowState, id: string): OriginState {
  const origin = state.origins.find((o) => o.id === id);
  if (origin === undefined) throw new Error(`unknown origin ${id}`);
  return origin;
}

function isKnownId(state: WindowState, id: string): boolean {
  return (
    state.lanes.some((queue) => queue.some((item) => item.id === id)) ||
    state.origins.some((origin) => origin.inFlight.some((item) => item.id === id))
  );
}

function laneAt(config: WindowConfig, lane: number): LaneConfig {
  const laneConfig = config.lanes[lane];
  if (laneConfig === undefined) throw new RangeError(`lane ${lane} is not configured`);
  return laneConfig;
}

function laneQueue(state: WindowState, lane: number): QueuedRequest[] {
  const queue = state.lanes[lane];
  if (queue === undefined) throw new RangeError(`lane ${lane} has no queue`);
  return queue;
}

function decayed(counter: DecayedCount, tauMs: number, now: number): number {
  // A clock that steps backwards decays nothing.
  return counter.value * Math.exp(-Math.max(0, now - counter.at) / tauMs);
}

function bump(counter: DecayedCount, by: number, tauMs: number, now: number): DecayedCount {
  return { value: decayed(counter, tauMs, now) + by, at: Math.max(now, counter.at) };
}

/** A count from a load report: origins are ours, but a bad number must not poison state. */
function count(value: number): number {
  return Number.isFinite(value) && value > 0 ? value : 0;
}

function assertTime(value: number, name: string): void {
  if (!Number.isFinite(value)) throw new RangeError(`${name} must be a finite time, got ${value}`);
}

function assertRequest(config: WindowConfig, req: WindowRequest): void {
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

function assertNever(value: never): never {
  throw new Error(`unhandled case ${String(value)}`);
}
