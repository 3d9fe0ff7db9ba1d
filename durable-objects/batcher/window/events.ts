/**
 * What the window learns from its origins and callers (docs/batching.md, "The window"): load
 * reports, first bytes, ends, cancels, and origins taken out of use until a given time.
 */
import type { LoadReport } from "../../../contracts/protocol/schema.ts";
import type {
  CancelOutcome,
  InFlightItem,
  ItemEventOutcome,
  OnDispatchedOptions,
  OriginEventOutcome,
  WindowState,
} from "./types.ts";
import { assertTime, bump, count, draft, laneQueue, originById } from "./state.ts";
import { inBatchLane } from "./terms.ts";

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
    prefillTokensPerMs: stepMsOf(report.prefill_tokens_per_s) / 1000 || null,
    prefillBacklogTokens:
      typeof report.prefill_backlog_tokens === "number"
        ? count(report.prefill_backlog_tokens)
        : null,
    prefixQueries: count(report.prefix_queries),
    prefixHits: count(report.prefix_hits),
    backgroundRunning: count(report.background_running ?? 0),
    backgroundQueued: count(report.background_queued ?? 0),
    backgroundCap: typeof report.background_cap === "number" ? count(report.background_cap) : null,
  };
  // The report counts what the origin had started when it wrote it (see
  // `InFlightItem.ackedAt`); the rest is still ours to add.
  const writtenAt = Number.isFinite(report.t) ? report.t : Number.NEGATIVE_INFINITY;
  origin.sentSinceReport = 0;
  origin.promptTokensSinceReport = 0;
  origin.doneSinceReport = 0;
  origin.inFlight = origin.inFlight.map((item) => {
    const counted = item.ackedAt !== null && writtenAt > item.ackedAt;
    if (!counted) {
      origin.sentSinceReport += 1;
      origin.promptTokensSinceReport += item.promptTokens;
    }
    return item.sinceReport === !counted ? item : { ...item, sinceReport: !counted };
  });
  return { state: next, outcome: { kind: "updated" } };
}

/**
 * The origin took these in-flight items at `originTime` (its clock on their call's first
 * load report): its reports written after that count them.
 */
export function onItemsAcked(
  state: WindowState,
  originId: string,
  itemIds: ReadonlySet<string>,
  originTime: number,
): WindowState {
  const origin = state.origins.find((o) => o.id === originId);
  const fresh = (item: InFlightItem) => item.ackedAt === null && itemIds.has(item.id);
  if (origin === undefined || !origin.inFlight.some(fresh)) return state;
  const next = draft(state);
  const drafted = originById(next, originId);
  drafted.inFlight = drafted.inFlight.map((item) =>
    fresh(item) ? { ...item, ackedAt: originTime } : item,
  );
  return next;
}

// A reported step time in ms: a finite positive number, else 0 (unknown).
function stepMsOf(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) && value > 0 ? value : 0;
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
  const index = inFlightIndex(state, originId, itemId);
  if (index < 0) return { state, outcome: { kind: "not-found" } };
  const next = draft(state);
  const origin = originById(next, originId);
  const found = origin.inFlight[index];
  if (found === undefined) throw new Error(`in-flight item ${itemId} vanished`);
  const item = { ...found, startedAt: found.startedAt ?? now };
  origin.inFlight[index] = item;
  // A batch line's first byte is its whole answer (and it waits for idle slots on purpose):
  // the wait term is what interactive requests wait (docs/batching.md, "The window").
  if (found.startedAt === null && options.countWait !== false && !inBatchLane(next.config, found)) {
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
  const index = inFlightIndex(state, originId, itemId);
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

// Where item `itemId` is in origin `originId`'s in-flight list; -1 when it is not there.
function inFlightIndex(state: WindowState, originId: string, itemId: string): number {
  const origin = state.origins.find((o) => o.id === originId);
  return origin?.inFlight.findIndex((i) => i.id === itemId) ?? -1;
}
