import { describe, expect, it } from "vitest";
import {
  CHANGE_COOLDOWN_MS,
  MERGE_AFTER_MS,
  REPORT_STALE_MS,
  SPLIT_AFTER_MS,
  type ShardsState,
  newShardsState,
  onShardReport,
} from "../../../durable-objects/batcher-shards/scaling.ts";
import type { ShardLoad } from "../../../durable-objects/batcher-shards/types.ts";

const SCALING = { minShards: 1, maxShards: 4, splitLagMs: 20 };
/** A time well after the epoch, as `Date.now()` gives. */
const T = 1_000_000;

/** Feeds reports of `load` from every shard once a second from `from` to `to` (ms). */
function feed(
  state: ShardsState,
  load: (shard: number, count: number) => Omit<ShardLoad, "shard">,
  from: number,
  to: number,
): { state: ShardsState; changes: { at: number; kind: string; count: number }[] } {
  const changes: { at: number; kind: string; count: number }[] = [];
  for (let now = from; now <= to; now += 1000) {
    for (let shard = 0; shard < state.count; shard++) {
      const result = onShardReport(state, { shard, ...load(shard, state.count) }, SCALING, now);
      state = result.state;
      if (result.decision.kind !== "keep") {
        changes.push({ at: now, kind: result.decision.kind, count: state.count });
      }
    }
  }
  return { state, changes };
}

describe("shard scaling", () => {
  it("starts at the fewest shards", () => {
    expect(newShardsState(SCALING)).toMatchObject({ count: 1, epoch: 0 });
  });

  it("doubles the count once a shard has lagged past the threshold for a while", () => {
    const start = 100_000;
    const { changes } = feed(
      newShardsState(SCALING),
      () => ({ lagMs: 40, inFlight: 300 }),
      start,
      start + SPLIT_AFTER_MS,
    );
    expect(changes).toEqual([{ at: start + SPLIT_AFTER_MS, kind: "split", count: 2 }]);
  });

  it("does not split on a lag that comes and goes", () => {
    const { changes } = feed(
      newShardsState(SCALING),
      () => ({ lagMs: 40, inFlight: 300 }),
      100_000,
      100_000 + SPLIT_AFTER_MS - 1000,
    );
    const calm = feed(
      onShardReport(newShardsState(SCALING), { shard: 0, lagMs: 5, inFlight: 1 }, SCALING, 0).state,
      (s) => ({ lagMs: s === 0 ? 40 : 0, inFlight: 1 }),
      100_000,
      100_000,
    );
    expect(changes).toEqual([]);
    expect(calm.changes).toEqual([]);
  });

  it("waits for the cooldown between splits and stops at the most shards", () => {
    const { changes } = feed(
      newShardsState(SCALING),
      () => ({ lagMs: 40, inFlight: 300 }),
      100_000,
      100_000 + 60_000,
    );
    expect(changes.map((c) => c.count)).toEqual([2, 4]);
    expect((changes[1]?.at ?? 0) - (changes[0]?.at ?? 0)).toBeGreaterThanOrEqual(
      CHANGE_COOLDOWN_MS,
    );
  });

  it("splits no further when the last split lowered neither the lag nor raised the load carried", () => {
    // Shards that share one thread: as much lag after the split, the same items in all.
    const { changes } = feed(
      newShardsState(SCALING),
      (_, count) => ({ lagMs: 40, inFlight: 300 / count }),
      T,
      T + 60_000,
    );
    expect(changes.map((c) => c.count)).toEqual([2]);
  });

  it("judges a split by its mean lag, not by one report that dipped", () => {
    // A starved thread: the lag swings between reports, as high on average after the split.
    let reports = 0;
    const { changes } = feed(
      newShardsState(SCALING),
      (_, count) => ({ lagMs: reports++ % 2 === 0 ? 30 : 90, inFlight: 300 / count }),
      T,
      T + 60_000,
    );
    expect(changes.map((c) => c.count)).toEqual([2]);
  });

  it("splits again once the last split lowered the lag and a shard lags anew", () => {
    const first = feed(newShardsState(SCALING), () => ({ lagMs: 40, inFlight: 300 }), T, T + 3000);
    const relieved = feed(first.state, () => ({ lagMs: 5, inFlight: 150 }), T + 4000, T + 6000);
    const again = feed(relieved.state, () => ({ lagMs: 40, inFlight: 150 }), T + 7000, T + 20_000);
    expect(again.changes.map((c) => c.count)).toEqual([4]);
  });

  it("never splits where the count is fixed", () => {
    const fixed = { minShards: 2, maxShards: 2, splitLagMs: 20 };
    let state = newShardsState(fixed);
    for (let now = 0; now < 30_000; now += 1000) {
      state = onShardReport(state, { shard: 0, lagMs: 500, inFlight: 900 }, fixed, now).state;
    }
    expect(state.count).toBe(2);
  });

  it("halves the count after every shard has been calm, under half the load of the split", () => {
    const split = feed(newShardsState(SCALING), () => ({ lagMs: 40, inFlight: 300 }), T, T + 3000);
    expect(split.state.count).toBe(2);
    const merged = feed(split.state, () => ({ lagMs: 1, inFlight: 50 }), T + 4000, T + 94_000);
    expect(merged.changes).toEqual([{ at: T + 4000 + MERGE_AFTER_MS, kind: "merge", count: 1 }]);
    expect(merged.state.epoch).toBe(2);
  });

  it("does not merge while the load is still near what forced the split", () => {
    const split = feed(newShardsState(SCALING), () => ({ lagMs: 40, inFlight: 300 }), T, T + 3000);
    // No lag now that there are two shards, but as many items as before: merging would lag again.
    const kept = feed(split.state, () => ({ lagMs: 1, inFlight: 150 }), T + 4000, T + 124_000);
    expect(kept.changes).toEqual([]);
  });

  it("counts a shard not heard from as idle", () => {
    const split = feed(newShardsState(SCALING), () => ({ lagMs: 40, inFlight: 300 }), T, T + 3000);
    let state = split.state;
    // Only shard 0 reports; shard 1 went quiet with a lagging last report.
    state = onShardReport(state, { shard: 1, lagMs: 40, inFlight: 140 }, SCALING, T + 4000).state;
    let merged = false;
    for (let now = T + 4000 + REPORT_STALE_MS; now <= T + 4000 + 2 * MERGE_AFTER_MS; now += 1000) {
      const result = onShardReport(state, { shard: 0, lagMs: 0, inFlight: 2 }, SCALING, now);
      state = result.state;
      merged ||= result.decision.kind === "merge";
    }
    expect(merged).toBe(true);
    expect(state.count).toBe(1);
  });

  it("ignores a report from a shard beyond the count (sent before a merge)", () => {
    const state = newShardsState(SCALING);
    const result = onShardReport(state, { shard: 3, lagMs: 900, inFlight: 9 }, SCALING, 0);
    expect(result.state).toBe(state);
  });
});
