import { describe, expect, it } from "vitest";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { batchingPlan } from "../../../contracts/config/plans.ts";
import { shardOf } from "../../../functions/delivery/batcher-plan.ts";

const config = loadConfig(
  JSON.stringify({
    models: [{ id: "m", max_model_len: 100 }],
    regions: [
      {
        id: "eu",
        origins: [
          { id: "eu-1", url: "http://eu-1" },
          { id: "eu-2", url: "http://eu-2" },
        ],
      },
    ],
    default_region: "eu",
    batching: { max_shards: 8 },
  }),
);
const plan = batchingPlan(config, { id: "eu" }, "m");

describe("a request's shard", () => {
  it("keeps a prefix on its shard or moves it to the one new shard when the count doubles", () => {
    if (plan === null) throw new Error("no plan");
    let moved = 0;
    for (let i = 0; i < 1000; i++) {
      const blocks = [i * 2_654_435_761, (i * 40_503) ^ 0x9e3779b9, i * 7 + 1, i * 97 + 3];
      const before = shardOf(plan, `r${i}`, undefined, blocks, 2);
      const after = shardOf(plan, `r${i}`, undefined, blocks, 4);
      expect([before, before + 2]).toContain(after);
      if (after !== before) moved += 1;
      // Halving brings it back.
      expect(shardOf(plan, `r${i}`, undefined, blocks, 2)).toBe(after % 2);
    }
    expect(moved).toBeGreaterThan(300);
    expect(moved).toBeLessThan(700);
  });

  it("is the first shard while there is one", () => {
    if (plan === null) throw new Error("no plan");
    expect(shardOf(plan, "r1", undefined, [123_456_789], 1)).toBe(0);
    expect(plan.scaling).toEqual({ minShards: 1, maxShards: 8, splitLagMs: 20 });
  });
});
