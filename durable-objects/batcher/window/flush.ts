/**
 * Admission and flushing (docs/batching.md, "The window"): `enqueue` sends a request at
 * once, queues it or refuses it; `tick` applies lane timeouts and flushes every due batch
 * that fits an origin, lanes in priority order and FIFO within a lane.
 */
import { chooseLeastLoaded } from "./origin-choice.ts";
import type { OriginCandidate, OriginChooser } from "./origin-choice.ts";
import { estimateRetryAfterMs, kvCapacityBound, leaveLanes } from "./leaving.ts";
import {
  type Batch,
  type EnqueueDecision,
  type FlushReason,
  type QueuedRequest,
  type TickResult,
  type OriginFilter,
  type WindowOptions,
  type WindowRequest,
  type WindowState,
} from "./types.ts";
import {
  assertRequest,
  assertTime,
  bump,
  draft,
  isKnownId,
  laneAt,
  laneQueue,
  queuedCount,
} from "./state.ts";
import {
  EVERY_ORIGIN,
  batchLaneOpen,
  batchSlots,
  candidateById,
  currentWindowMs,
  hasRoom,
  healthyCandidates,
  inBatchLane,
  placeableCandidates,
} from "./terms.ts";

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
  const usable = options.usable ?? EVERY_ORIGIN;
  const windowMs = currentWindowMs(next, now, usable);
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
    ...(req.target !== undefined && { target: req.target }),
  };

  if (queuedCount(next) === 0 && deadline > now) {
    // A lone request never waits for a window that nobody else will join: when the
    // origins keep up (window 0) or the chosen origin is idle, it leaves now.
    const candidates = placeableCandidates(
      next.config,
      roomyCandidates(next, now, usable),
      item,
      batchLaneOpen(next, now),
    );
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
 * Takes out what leaves the lanes otherwise (timeouts, too large, no usable origin: see
 * `leaveLanes`), then flushes every batch that is due and fits an origin. Call it at
 * `nextWakeAt`, after a `queued` decision that is due, and after any event that frees
 * capacity or changes which origins are usable (`onItemDone`, `onOriginLoad`, a breaker).
 */
export function tick(state: WindowState, now: number, options: WindowOptions = {}): TickResult {
  assertTime(now, "now");
  const next = draft(state);
  const usable = options.usable ?? EVERY_ORIGIN;
  const notices = leaveLanes(next, now, usable);
  const batches = flushDue(next, now, options.chooseOrigin ?? chooseLeastLoaded, usable);
  return { state: next, batches, notices, nextWakeAt: nextWakeAt(next, now) };
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

export function flushAt(state: WindowState, now: number): number {
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

function flushDue(
  state: WindowState,
  now: number,
  choose: OriginChooser,
  usable: OriginFilter,
): Batch[] {
  const batches: Batch[] = [];
  for (;;) {
    const reason = dueReason(state, now);
    if (reason === null) return batches;
    const candidates = roomyCandidates(state, now, usable);
    // The head is the first request some origin with room may take: one that avoids every
    // such origin waits for room elsewhere without holding up the rest.
    const batchOpen = batchLaneOpen(state, now);
    const head = firstPlaceable(state, candidates, batchOpen);
    if (head === null) return batches;
    const originId = choose(placeableCandidates(state.config, candidates, head, batchOpen), head);
    if (originId === null) return batches;
    const taken = fillBatch(
      state,
      candidateById(candidates, originId),
      head,
      candidates,
      batchOpen,
    );
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
 * The usable origins that may be sent more now. When none may, requests wait in their
 * lanes (bounded by each lane's timeout and `maxQueue`) rather than in the engines' queues,
 * where lanes and cancels no longer reach them (docs/batching.md, "Backpressure").
 */
function roomyCandidates(state: WindowState, now: number, usable: OriginFilter): OriginCandidate[] {
  return healthyCandidates(state, now, usable).filter((c) => hasRoom(c, state.config));
}

/**
 * Fills one batch for `origin`: lanes in priority order, FIFO within a lane, up to the
 * size and token limits, the origin's room for sequences and its KV room. Stops at the first request that does
 * not fit rather than letting later ones overtake it, as vLLM's FCFS scheduler does, so
 * a long prompt is delayed but never starved; it may still go to another origin. A
 * request that avoids this origin is passed over: it is not short of room, it may only
 * go elsewhere; so is one the router placed on another origin that is up, unless it is
 * the head this batch is for.
 */
function fillBatch(
  state: WindowState,
  origin: OriginCandidate,
  head: QueuedRequest,
  candidates: readonly OriginCandidate[],
  batchOpen: boolean,
): QueuedRequest[] {
  const { maxBatchSize, maxBatchTokens } = state.config;
  const taken: QueuedRequest[] = [];
  let tokens = 0;
  let kvRoom = origin.kvRoomTokens;
  const up = new Set(candidates.map((c) => c.id));
  for (const queue of state.lanes) {
    for (const item of queue) {
      if (item.avoidOrigins?.includes(origin.id) === true) continue;
      const { target } = item;
      if (target !== undefined && target !== origin.id && item !== head && up.has(target)) {
        continue;
      }
      const itemTokens = item.promptTokens + item.maxTokens;
      if (taken.length >= maxBatchSize) return taken;
      if (origin.room !== null && taken.length >= origin.room) return taken;
      if (taken.length > 0 && tokens + itemTokens > maxBatchTokens) return taken;
      if (kvRoom !== null && item.promptTokens > kvRoom) return taken;
      // Batch lines last, only into the running slots left free, and only while the lane
      // is open (docs/batch-api.md, "Interactive first").
      if (inBatchLane(state.config, item) && (!batchOpen || taken.length >= batchSlots(origin))) {
        return taken;
      }
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
      ackedAt: null,
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

export function nextWakeAt(state: WindowState, now: number): number | null {
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
    // Due but no origin can take the head: wake when an untrusted report expires; an
    // origin that comes back, completions and reports call `tick` anyway. A closed batch
    // lane is looked at again one rate window on, as its thread's lag decays.
    for (const origin of state.origins) {
      if (origin.report !== null && origin.inFlight.length === 0) {
        consider(origin.report.receivedAt + state.config.loadReportTtlMs);
      }
    }
    if (!batchLaneOpen(state, now)) consider(now + state.config.rateWindowMs);
  }
  return wake;
}

function firstPlaceable(
  state: WindowState,
  candidates: readonly OriginCandidate[],
  batchOpen: boolean,
): QueuedRequest | null {
  for (const queue of state.lanes) {
    for (const item of queue) {
      if (placeableCandidates(state.config, candidates, item, batchOpen).length > 0) return item;
    }
  }
  return null;
}
