import { describe, expect, it } from "vitest";
import { runChaos } from "../../bench/chaos-core.ts";

// The chaos trial of `npm run bench:chaos`, bounded: a few hundred requests through real
// origin processes that fail, one origin crash and one edge crash; every request matched
// to its ledger record and its origins' outcome, and nothing may be lost.
describe("the edge under faults and crashes", () => {
  it("bills every outcome for what its origins generated and leaks nothing", async () => {
    const report = await runChaos({
      requests: 300,
      concurrency: 30,
      seed: 5,
      timeScale: 1,
      earlyWaitMs: 3_000,
      settleWaitMs: 30_000,
    });
    const sent = report.bills.reduce((n, row) => n + row.sent, 0);
    const complete = report.bills.find((row) => row.outcome === "complete");
    expect(sent).toBe(300);
    expect(complete?.sent).toBeGreaterThan(50);
    expect(complete?.exact).toBe(complete?.sent);
    // What the client saw of each loss, should there be any.
    if (Object.values(report.losses).some((n) => n > 0)) {
      console.error("chaos losses:", JSON.stringify(report.examples));
    }
    expect(Object.entries(report.losses).filter(([, n]) => n !== 0)).toEqual([]);
  }, 240_000);
});
