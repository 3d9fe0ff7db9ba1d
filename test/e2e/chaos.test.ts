import { describe, expect, it } from "vitest";
import { runChaos } from "../../bench/chaos-core.ts";

// The chaos trial of `npm run bench:chaos`, bounded: a few hundred requests through real
// origin processes that fail, one origin crash and one edge crash; nothing may be lost.
describe("the edge under faults and crashes", () => {
  it("bills every complete answer exactly once and leaks nothing", async () => {
    const report = await runChaos({
      requests: 300,
      concurrency: 30,
      seed: 5,
      timeScale: 1,
      settleWaitMs: 30_000,
    });
    expect(report.counts.sent).toBe(300);
    expect(report.counts.complete).toBeGreaterThan(50);
    expect(report.counts.billedExactly).toBe(report.counts.complete);
    // What the client saw of each loss, should there be any.
    if (Object.values(report.losses).some((n) => n > 0)) {
      console.error("chaos losses:", JSON.stringify(report.examples));
    }
    expect(report.losses).toEqual({
      lost_bills: 0,
      double_bills: 0,
      reservations_left_open: 0,
      slots_leaked_after_30s: 0,
      silently_truncated_200s: 0,
      cut_recorded_ok: 0,
      "5xx_edge_errors": 0,
      non_openai_error_bodies: 0,
    });
  }, 240_000);
});
