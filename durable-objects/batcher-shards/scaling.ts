/**
 * When a region and model's Batchers split or merge (docs/batching.md, "Shards"): a pure
 * core over the shards' load reports. A shard whose thread lags past `splitLagMs` for
 * `SPLIT_AFTER_MS` doubles the count (up to `maxShards`), unless the last split helped
 * neither the lag nor the load carried; when every shard has been calm and the load well
 * below what forced the last split for `MERGE_AFTER_MS`, it halves.
 */
import type { ShardScaling } from "../../contracts/config/plans.ts";
import type { ShardCount, ShardLoad } from "./types.ts";

/** How long a shard must lag past `splitLagMs` before the count doubles. */
export const SPLIT_AFTER_MS = 3_000;
/** How long every shard must be calm before the count halves. */
export const MERGE_AFTER_MS = 30_000;
/** Least time between two changes: the new shards take their share of the load meanwhile. */
export const CHANGE_COOLDOWN_MS = 10_000;
/** A shard not heard from for this long counts as idle (shards report only while busy). */
export const REPORT_STALE_MS = 3_000;
/** A merge waits until every shard lags less than this share of `splitLagMs` … */
export const MERGE_LAG_SHARE = 0.5;
/** … and all of them run less than this share of the items that forced the last split. */
export const MERGE_LOAD_SHARE = 0.5;
/**
 * A split helped once the mean lag reported since fell below this share of the mean lag
 * reported before it (a lag swings from one report to the next on a busy thread), or the
 * shards carried `1 / HELPED_SHARE` times its load; until then no further split (shards
 * that share one thread, as under a local runtime, gain nothing from more of them).
 */
export const HELPED_SHARE = 0.75;
/** Reports after a split before its lag is judged. */
export const HELPED_AFTER_REPORTS = 4;

/** The directory's state: the count (persisted) and the reports since it last changed. */
export interface ShardsState extends ShardCount {
  changedAt: number;
  /** Items in flight and the worst lag when each split happened, the latest last (persisted). */
  splits: { load: number; lagMs: number }[];
  /** Whether the last split lowered the lag or carried more load (see {@link HELPED_SHARE}). */
  helped: boolean;
  /** The lags reported since the count last changed, summed, and how many. */
  lagSum: number;
  lagReports: number;
  /** Each shard's last report and when it came. */
  reports: ReadonlyMap<number, ShardLoad & { at: number }>;
  /** Since when each shard has lagged past `splitLagMs` without a break. */
  laggingSince: ReadonlyMap<number, number>;
  /** Since when every shard has been calm enough to merge; null while one is not. */
  calmSince: number | null;
}

/** What a report changed. */
export type ShardsDecision = { kind: "keep" } | { kind: "split" } | { kind: "merge" };

/** A directory that has never changed: `minShards` shards. */
export function newShardsState(scaling: ShardScaling): ShardsState {
  return {
    count: scaling.minShards,
    epoch: 0,
    changedAt: 0,
    splits: [],
    helped: true,
    lagSum: 0,
    lagReports: 0,
    reports: new Map(),
    laggingSince: new Map(),
    calmSince: null,
  };
}

/** Takes one shard's report and decides whether the count changes. */
export function onShardReport(
  state: ShardsState,
  load: ShardLoad,
  scaling: ShardScaling,
  now: number,
): { state: ShardsState; decision: ShardsDecision } {
  // A shard beyond the count reports from before a merge: its load is its old share's.
  if (load.shard >= state.count) return { state, decision: { kind: "keep" } };
  const reports = new Map(state.reports).set(load.shard, { ...load, at: now });
  const laggingSince = new Map(state.laggingSince);
  if (load.lagMs >= scaling.splitLagMs) {
    if (!laggingSince.has(load.shard)) laggingSince.set(load.shard, now);
  } else {
    laggingSince.delete(load.shard);
  }
  const next = { ...state, reports, laggingSince };
  next.lagSum += load.lagMs;
  next.lagReports += 1;
  next.helped ||= helped(next, now);
  const cooled = now - state.changedAt >= CHANGE_COOLDOWN_MS;
  if (cooled && next.helped && state.count < scaling.maxShards && lagsLongEnough(next, now)) {
    const split = { load: totalInFlight(next, now), lagMs: next.lagSum / next.lagReports };
    return { state: changed(next, state.count * 2, now, split), decision: { kind: "split" } };
  }
  const calm = state.count > scaling.minShards && isCalm(next, scaling, now);
  const calmSince = calm ? (state.calmSince ?? now) : null;
  if (calm && cooled && calmSince !== null && now - calmSince >= MERGE_AFTER_MS) {
    return { state: changed(next, state.count / 2, now, null), decision: { kind: "merge" } };
  }
  return { state: { ...next, calmSince }, decision: { kind: "keep" } };
}

function helped(state: ShardsState, now: number): boolean {
  const split = state.splits.at(-1);
  if (split === undefined) return true;
  return (
    (state.lagReports >= HELPED_AFTER_REPORTS &&
      state.lagSum / state.lagReports < split.lagMs * HELPED_SHARE) ||
    totalInFlight(state, now) * HELPED_SHARE > split.load
  );
}

function lagsLongEnough(state: ShardsState, now: number): boolean {
  for (const [shard, since] of state.laggingSince) {
    const report = state.reports.get(shard);
    // A lag reported long ago says nothing of now.
    if (
      report !== undefined &&
      now - report.at < REPORT_STALE_MS &&
      now - since >= SPLIT_AFTER_MS
    ) {
      return true;
    }
  }
  return false;
}

function isCalm(state: ShardsState, scaling: ShardScaling, now: number): boolean {
  for (const report of state.reports.values()) {
    if (now - report.at >= REPORT_STALE_MS) continue;
    if (report.lagMs >= scaling.splitLagMs * MERGE_LAG_SHARE) return false;
  }
  const atSplit = state.splits.at(-1);
  return atSplit === undefined || totalInFlight(state, now) < atSplit.load * MERGE_LOAD_SHARE;
}

function totalInFlight(state: ShardsState, now: number): number {
  let total = 0;
  for (const report of state.reports.values()) {
    if (now - report.at < REPORT_STALE_MS) total += report.inFlight;
  }
  return total;
}

// Every report came from the old count's shares: each shard starts anew.
function changed(
  state: ShardsState,
  count: number,
  now: number,
  split: ShardsState["splits"][number] | null,
): ShardsState {
  return {
    count,
    epoch: state.epoch + 1,
    changedAt: now,
    splits: split === null ? state.splits.slice(0, -1) : [...state.splits, split],
    // Until the new shards have shown what the split did; a merge goes back to a count
    // that was worth its split.
    helped: split === null,
    lagSum: 0,
    lagReports: 0,
    reports: new Map(),
    laggingSince: new Map(),
    calmSince: null,
  };
}
