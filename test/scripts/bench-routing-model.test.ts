import { describe, expect, it } from "vitest";
import { runModel } from "../../bench/routing-model.ts";
import {
  agents,
  hotFew,
  hotPrefix,
  multiTurn,
  sharedPrefix,
} from "../../bench/routing-workloads.ts";

// The routing bench's workloads in simulated time (bench/routing-model.ts): placement keeps
// caches warm without piling work on one origin.
describe("routing in the bench's model", () => {
  it("spreads agents on one system prompt while each keeps its history", () => {
    const result = runModel({ workload: agents(48), policy: "warmgate", origins: 4, rate: 8 });
    expect(result.hitRate / result.ceiling).toBeGreaterThanOrEqual(0.95);
    // Below one origin's capacity: within twice the mean, and no more than its fair share
    // of the streams in flight on the busiest origin.
    expect(Math.max(result.imbalance, result.decodeImbalance)).toBeLessThanOrEqual(2);
    expect(result.busiestShare).toBeLessThanOrEqual(1.3 / 4);
  });

  it("copies agents' shared system prompt to every one of eight origins", () => {
    // Seven holders each carry 8/7 of an even share, within the load bound: without a copy
    // to the eighth it would idle (busiest share 0.171 in the model, 0.173 in the bench).
    const result = runModel({ workload: agents(96), policy: "warmgate", origins: 8, rate: 16 });
    expect(result.hitRate / result.ceiling).toBeGreaterThanOrEqual(0.95);
    expect(result.perOrigin.every((n) => n > 0)).toBe(true);
    expect(result.busiestShare).toBeLessThanOrEqual(1.3 / 8);
  });

  it("copies a few hot prefixes past one origin's capacity and keeps loads within the bound", () => {
    const result = runModel({ workload: hotFew(480, 2), policy: "warmgate", origins: 4, rate: 60 });
    expect(result.hitRate / result.ceiling).toBeGreaterThanOrEqual(0.95);
    expect(Math.max(result.imbalance, result.decodeImbalance)).toBeLessThanOrEqual(1.3);
    expect(result.perOrigin.every((n) => n > 0)).toBe(true);
  });

  it("spreads a few hot prefixes and the long prompts beside them over the origins by load", () => {
    const result = runModel({
      workload: hotPrefix(480, 2),
      policy: "warmgate",
      origins: 4,
      rate: 90,
    });
    expect(result.hitRate / result.ceiling).toBeGreaterThanOrEqual(0.95);
    expect(Math.max(result.imbalance, result.decodeImbalance)).toBeLessThanOrEqual(1.3);
  });

  it("keeps eight origins' engines evenly busy under a few hot prefixes and new long prompts", () => {
    // By requests the origin that takes the new 4,000-token prompts serves few (docs/
    // benchmarks.md, "Routing"); by engine time it is as busy as the rest.
    const result = runModel({
      workload: hotPrefix(960, 4),
      policy: "warmgate",
      origins: 8,
      rate: 180,
    });
    const mean = result.busyMs.reduce((a, b) => a + b, 0) / result.busyMs.length;
    expect(Math.max(...result.busyMs) / mean).toBeLessThanOrEqual(1.2);
    expect(Math.min(...result.busyMs) / mean).toBeGreaterThanOrEqual(0.8);
  });

  it("keeps shared prompts warm and the origins even past the ring's busiest origin's prefill", () => {
    const result = runModel({
      workload: sharedPrefix(48, 20),
      policy: "warmgate",
      origins: 4,
      rate: 240,
    });
    expect(result.hitRate / result.ceiling).toBeGreaterThanOrEqual(0.95);
    expect(Math.max(result.imbalance, result.decodeImbalance)).toBeLessThanOrEqual(1.3);
  });

  it("keeps each conversation on the origin that holds its history", () => {
    const result = runModel({
      workload: multiTurn(64, 12, 2_000),
      policy: "warmgate",
      origins: 4,
      rate: 32,
    });
    expect(result.hitRate / result.ceiling).toBeGreaterThanOrEqual(0.95);
    // Each conversation's first turn is placed cold; every later one is a hit where it was.
    expect(result.placements?.spread).toBe(0);
    expect(result.placements?.cold).toBe(64);
  });
});
