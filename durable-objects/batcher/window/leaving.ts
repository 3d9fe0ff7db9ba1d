/**
 * How requests leave their lanes other than in a batch (docs/batching.md, "Backpressure"):
 * past their lane's timeout, too large for every origin's cache, or with no usable origin
 * left to them (every one they may go to is behind its breaker).
 */
import type { LaneConfig } from "../../../contracts/config/batching.ts";
import { assertNever, decayed, laneAt } from "./state.ts";
import { allowedCandidates, healthyCandidates } from "./terms.ts";
import {
  MIN_RETRY_AFTER_MS,
  type OriginFilter,
  type QueuedRequest,
  type TickNotice,
  type WindowState,
} from "./types.ts";

/**
 * Takes out of the lanes of `state`, a draft (see `tick`), every request that leaves them
 * now, with why: past its deadline (a `reject` lane; a `wait` lane keeps it, overdue), too
 * large for every origin, or with no usable origin left to it. The last is refused as
 * admission would refuse it now, so that its caller tries another region at once instead
 * of waiting out a breaker's cooldown, or its lane's timeout, in the lane.
 */
export function leaveLanes(state: WindowState, now: number, usable: OriginFilter): TickNotice[] {
  const notices: TickNotice[] = [];
  const capacityTokens = kvCapacityBound(state);
  const up = healthyCandidates(state, now, usable);
  for (const [lane, queue] of state.lanes.entries()) {
    const laneConfig = laneAt(state.config, lane);
    const kept: QueuedRequest[] = [];
    for (const queued of queue) {
      let item = queued;
      if (!item.overdue && item.deadline <= now) {
        switch (laneConfig.onTimeout) {
          case "reject": {
            const retryAfterMs = estimateRetryAfterMs(state, queue.length, laneConfig, now);
            notices.push({ kind: "timed-out", item, retryAfterMs });
            continue;
          }
          case "wait":
            item = { ...item, overdue: true };
            notices.push({ kind: "overdue", item: { ...item } });
            break;
          default:
            assertNever(laneConfig.onTimeout);
        }
      }
      if (capacityTokens !== null && item.promptTokens > capacityTokens) {
        notices.push({ kind: "too-large", item, capacityTokens });
      } else if (allowedCandidates(up, item).length === 0) {
        notices.push({ kind: "no-origin", item });
      } else {
        kept.push(item);
      }
    }
    state.lanes[lane] = kept;
  }
  return notices;
}

/** Largest prompt any origin could ever hold, once every origin has reported; else null. */
export function kvCapacityBound(state: WindowState): number | null {
  let bound = 0;
  for (const origin of state.origins) {
    if (origin.report === null || origin.report.kvTotalTokens === 0) return null;
    bound = Math.max(bound, origin.report.kvTotalTokens);
  }
  return bound;
}

/** How long the lanes take to drain `ahead` requests at the recent rate, within the lane's timeout. */
export function estimateRetryAfterMs(
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
