/**
 * How requests leave their lanes other than in a batch (docs/batching.md, "Backpressure"):
 * past their lane's timeout, too large for every origin's cache, or with no usable origin
 * left to them (every one they may go to is behind its breaker).
 */
import type { LaneConfig } from "../../../contracts/config/batching.ts";
import { assertNever, decayed, laneAt } from "./state.ts";
import {
  MIN_RETRY_AFTER_MS,
  type OriginFilter,
  type QueuedRequest,
  type TickNotice,
  type WindowState,
} from "./types.ts";

/** Takes out of `state`'s lanes (in place) every request that leaves them now, with why. */
export function leaveLanes(state: WindowState, now: number, usable: OriginFilter): TickNotice[] {
  const notices: TickNotice[] = [];
  for (const [lane, queue] of state.lanes.entries()) {
    const laneConfig = laneAt(state.config, lane);
    const kept: QueuedRequest[] = [];
    for (const item of queue) {
      if (item.overdue || item.deadline > now) {
        kept.push(item);
        continue;
      }
      switch (laneConfig.onTimeout) {
        case "reject": {
          const retryAfterMs = estimateRetryAfterMs(state, queue.length, laneConfig, now);
          notices.push({ kind: "timed-out", item, retryAfterMs });
          break;
        }
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
    state.lanes[lane] = kept;
  }

  const capacityTokens = kvCapacityBound(state);
  // Refused as admission would refuse it now, so that its caller tries another region at
  // once rather than waiting out a breaker's cooldown, or its lane's timeout, in the lane.
  const up = state.origins.map((o) => o.id).filter((id) => usable(id));
  for (const [lane, queue] of state.lanes.entries()) {
    state.lanes[lane] = queue.filter((item) => {
      if (capacityTokens !== null && item.promptTokens > capacityTokens) {
        notices.push({ kind: "too-large", item, capacityTokens });
        return false;
      }
      if (up.some((id) => item.avoidOrigins?.includes(id) !== true)) return true;
      notices.push({ kind: "no-origin", item });
      return false;
    });
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
