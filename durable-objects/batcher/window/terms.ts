/**
 * How long requests wait (docs/batching.md, "The window"): the overload, call and wait
 * terms of the adaptive window, the thread-lag measures and the token hold, and the origins
 * as the origin chooser sees them.
 */
import type { OriginCandidate } from "./origin-choice.ts";
import type { WindowConfig } from "../../../contracts/config/batching.ts";
import type { OriginFilter, OriginState, WindowState } from "./types.ts";
import { assertTime, bump, decayed, decayedMean, originById } from "./state.ts";

/**
 * The window a request arriving now would wait, in ms: the largest of the overload, call
 * and wait terms (see the top of this file), at most `maxWindowMs`. 0 while the origins
 * keep up with all three.
 */
export function currentWindowMs(
  state: WindowState,
  now: number,
  usable: OriginFilter = EVERY_ORIGIN,
): number {
  const candidates = healthyCandidates(state, now, usable);
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
 * writes for a share of that lag buys back the time it is short of. Below `holdMinInFlight`
 * items running at once nothing is held, however the thread lags: there a hold only bunches
 * tokens that the thread could still send one by one (docs/batching.md, "Token holds").
 */
export function tokenHoldMs(state: WindowState, now: number): number {
  const { holdShare, maxHoldMs, holdMinInFlight } = state.config;
  if (holdShare <= 0 || itemsInFlight(state) < holdMinInFlight) return 0;
  const holdMs = Math.min(maxHoldMs, holdShare * meanThreadLagMs(state, now));
  return holdMs >= MIN_HOLD_MS ? holdMs : 0;
}

/** Items running on every origin now. */
function itemsInFlight(state: WindowState): number {
  let items = 0;
  for (const origin of state.origins) items += origin.inFlight.length;
  return items;
}

/** The recent mean lag of the batcher's thread ({@link recordThreadLag}); 0 without one. */
export function meanThreadLagMs(state: WindowState, now: number): number {
  return decayedMean(state.threadLagMs, state.threadLags, state.config.rateWindowMs, now);
}

/** Every origin may take requests: the default where nobody says otherwise. */
export const EVERY_ORIGIN: OriginFilter = () => true;

/** The origins the policy may send to now (those `usable`), as the origin chooser sees them. */
export function healthyCandidates(
  state: WindowState,
  now: number,
  usable: OriginFilter = EVERY_ORIGIN,
): OriginCandidate[] {
  const candidates: OriginCandidate[] = [];
  for (const origin of state.origins) {
    if (!usable(origin.id)) continue;
    candidates.push(candidateOf(origin, state.config, now));
  }
  return candidates;
}

function candidateOf(origin: OriginState, config: WindowConfig, now: number): OriginCandidate {
  const inFlight = origin.inFlight.length;
  const report = origin.report;
  // With nothing of ours in flight no response will bring a fresher report, so an old
  // one that says "full" would hold requests back forever; past the TTL we probe instead.
  const trusted =
    report !== null && (inFlight > 0 || now - report.receivedAt < config.loadReportTtlMs);
  if (!trusted) {
    return {
      id: origin.id,
      load: inFlight,
      freeSlots: null,
      room: null,
      kvRoomTokens: null,
      inFlight,
    };
  }
  const allLoad = Math.max(
    0,
    report.running +
      report.waiting +
      report.backgroundQueued +
      origin.sentSinceReport -
      origin.doneSinceReport,
  );
  // Batch lines give their slot up to interactive requests at the origin (docs/batch-api.md,
  // "The batch lane"): to every other lane they take none.
  let batchSince = 0;
  for (const item of origin.inFlight) {
    if (item.sinceReport && inBatchLane(config, item)) batchSince++;
  }
  const load = Math.max(
    0,
    allLoad - report.backgroundRunning - report.backgroundQueued - batchSince,
  );
  // Sequences already waiting mean the engine is not starting more right now.
  const freeSlots = report.waiting > 0 ? 0 : Math.max(0, report.maxNumSeqs - load);
  // An engine that does not say how many sequences it runs at once is never held for.
  const room =
    report.maxNumSeqs > 0 ? Math.max(0, report.maxNumSeqs + config.maxOriginQueue - load) : null;
  const kvRoomTokens = Math.max(0, report.kvFreeTokens - origin.promptTokensSinceReport);
  const engine = {
    maxNumSeqs: report.maxNumSeqs,
    stepMs: report.stepMs,
    prefillTokensPerMs: report.prefillTokensPerMs,
    prefillBacklogTokens: report.prefillBacklogTokens,
    reportedAt: report.receivedAt,
    batchLoad: allLoad,
    backgroundCap: report.backgroundCap,
  };
  return { id: origin.id, load, freeSlots, room, kvRoomTokens, inFlight, engine };
}

/**
 * Whether an origin may be sent more now (docs/batching.md, "Backpressure"): yes unless its
 * engine already queues about `maxOriginQueue` sequences beyond its slots. Once full it
 * takes more only when half that queue has room again, so that work leaves in batches
 * while the engine still has its own queue to start from, not one call per finished item.
 */
export function hasRoom(candidate: OriginCandidate, config: WindowConfig): boolean {
  return candidate.room === null || candidate.room >= refillAt(config);
}

/** Room an origin must have again before a held batch leaves for it. */
export function refillAt(config: WindowConfig): number {
  return Math.max(1, Math.ceil(config.maxOriginQueue / 2));
}

export function candidateById(candidates: readonly OriginCandidate[], id: string): OriginCandidate {
  const candidate = candidates.find((c) => c.id === id);
  if (candidate === undefined) throw new Error(`origin chooser returned unknown origin ${id}`);
  return candidate;
}

/** The candidates a request may go to (all of them unless it avoids some). */
export function allowedCandidates(
  candidates: readonly OriginCandidate[],
  item: { avoidOrigins?: readonly string[] },
): readonly OriginCandidate[] {
  const avoid = item.avoidOrigins;
  if (avoid === undefined || avoid.length === 0) return candidates;
  return candidates.filter((candidate) => !avoid.includes(candidate.id));
}

/** Whether a request waits in the batch lane (docs/batch-api.md). */
export function inBatchLane(config: WindowConfig, item: { lane: number }): boolean {
  return config.batchLane !== undefined && item.lane === config.batchLane;
}

/**
 * Share of an origin's slots the batch lane sends beyond what the origin may start now:
 * lines it holds ready (outside its engine) for the next slot that frees, so the slots
 * do not wait for a trip to the edge and back.
 */
export const BATCH_ORIGIN_QUEUE_SHARE = 0.25;

/**
 * Batch lines an origin may be sent now: as many as it says it runs at once (its slots
 * less the reserve it keeps for interactive items, `background_cap`), plus
 * {@link BATCH_ORIGIN_QUEUE_SHARE} of its slots held ready at the origin, less everything
 * it runs, queues or holds. The origin starts them only into slots interactive requests
 * leave. An origin without a trusted report, or whose report says neither its slots nor
 * its cap, takes one when idle.
 */
export function batchSlots(candidate: OriginCandidate): number {
  const { engine } = candidate;
  if (engine === undefined || engine.maxNumSeqs === 0 || engine.backgroundCap === null) {
    return candidate.load === 0 && candidate.inFlight === 0 ? 1 : 0;
  }
  const held = Math.ceil(engine.maxNumSeqs * BATCH_ORIGIN_QUEUE_SHARE);
  return Math.max(0, engine.backgroundCap + held - engine.batchLoad);
}

/**
 * Whether the batch lane may send now: not while the Batcher's thread lags past
 * `batchMaxLagMs` and interactive requests run or wait, whose first tokens and streams
 * would queue behind the lines' work on that thread. The lag is the recent mean, which
 * falls to 0 once the thread stops stalling.
 */
export function batchLaneOpen(state: WindowState, now: number): boolean {
  const { config } = state;
  if (config.batchLane === undefined) return true;
  if (meanThreadLagMs(state, now) <= config.batchMaxLagMs) return true;
  const interactive = (item: { lane: number }) => !inBatchLane(config, item);
  return (
    !state.lanes.some((queue) => queue.some(interactive)) &&
    !state.origins.some((origin) => origin.inFlight.some(interactive))
  );
}

/**
 * The candidates a request may go to now: those it does not avoid, and for a batch line,
 * none while the lane is closed ({@link batchLaneOpen}), else those with a slot for it.
 */
export function placeableCandidates(
  config: WindowConfig,
  candidates: readonly OriginCandidate[],
  item: { lane: number; avoidOrigins?: readonly string[] },
  batchOpen: boolean,
): readonly OriginCandidate[] {
  const allowed = allowedCandidates(candidates, item);
  if (!inBatchLane(config, item)) return allowed;
  if (!batchOpen) return [];
  return allowed.filter((candidate) => batchSlots(candidate) > 0);
}
