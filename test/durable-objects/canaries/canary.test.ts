import { describe, expect, it } from "vitest";
import type { CanarySpec } from "../../../contracts/config/canaries.ts";
import {
  act,
  newCanary,
  record,
  viewOf,
  weightOf,
} from "../../../durable-objects/canaries/canary.ts";

const SPEC: CanarySpec = {
  model: "m",
  origins: ["c-1"],
  weight: 0.1,
  minRequests: 10,
  maxErrorRateIncrease: 0.05,
  maxTtftP95Ratio: 1.5,
};

const ttfts = (n: number, ms: number) => Array.from({ length: n }, () => ms);

/** An arm's requests, errors and TTFTs (each `ms`, or none). */
const arm = (requests: number, errors: number, ms?: number) => ({
  requests,
  errors,
  ttftMs: ms === undefined ? [] : ttfts(requests, ms),
});

/** A new canary of model `m` after one report of both arms at `at`. */
const afterReport = (
  canary: ReturnType<typeof arm>,
  baseline: ReturnType<typeof arm>,
  at: number,
) => record(newCanary("m", 0), { canary, baseline }, SPEC, at);

describe("a running canary", () => {
  it("is rolled back once both arms have enough requests and its error rate is too high", () => {
    const early = afterReport(arm(9, 9), arm(100, 0), 1);
    expect(early.state).toBe("running");
    const late = record(early, { canary: { requests: 1, errors: 0, ttftMs: [] } }, SPEC, 2);
    expect(late).toMatchObject({ state: "rolled_back", since: 2 });
    expect(late.reason).toMatch(/error rate 90\.0% against 0\.0%/);
  });

  it("is rolled back when its TTFT p95 is more than 1.5 times the baseline's", () => {
    const slow = afterReport(arm(20, 0, 400), arm(20, 0, 100), 5);
    expect(slow.state).toBe("rolled_back");
    expect(slow.reason).toBe("TTFT p95 400 ms against 100 ms");
  });

  it("keeps running while it is as good as the baseline", () => {
    const fine = afterReport(arm(50, 1, 110), arm(500, 5, 100), 5);
    expect(fine.state).toBe("running");
    expect(viewOf(fine, SPEC).arms.canary).toMatchObject({
      requests: 50,
      errors: 1,
      error_rate: 0.02,
      ttft_p50_ms: 110,
      ttft_p95_ms: 110,
    });
  });
});

describe("an operator", () => {
  it("promotes, pauses, resumes and rolls back, and the weight follows", () => {
    const c = newCanary("m", 0);
    expect(weightOf(act(c, "promote", 1).state, SPEC)).toBe(1);
    expect(weightOf(act(c, "pause", 1).state, SPEC)).toBe(0);
    expect(weightOf(act(act(c, "pause", 1), "resume", 2).state, SPEC)).toBe(0.1);
    expect(act(c, "rollback", 3)).toMatchObject({
      state: "rolled_back",
      reason: "rolled back by an operator",
    });
  });

  it("resumes a rolled-back canary with a fresh comparison", () => {
    const bad = afterReport(arm(10, 10), arm(10, 0), 1);
    const again = act(bad, "resume", 2);
    expect(again.state).toBe("running");
    expect(viewOf(again, SPEC).arms.canary.requests).toBe(0);
  });
});

describe("a report", () => {
  it("recorded while its reporter knew an earlier state is left out of the comparison", () => {
    const resumed = act(afterReport(arm(5, 5), arm(5, 0), 1), "resume", 10);
    expect(viewOf(resumed, SPEC).arms.canary.requests).toBe(0);
    // Outcomes of the state before the resume, sent after it: not this state's.
    const late = record(resumed, { canary: arm(3, 3) }, SPEC, 11, 0);
    expect(viewOf(late, SPEC).arms.canary.requests).toBe(0);
    // Outcomes recorded knowing the resume, or knowing no state yet, count.
    const known = record(resumed, { canary: arm(3, 1) }, SPEC, 12, 10);
    expect(viewOf(known, SPEC).arms.canary).toMatchObject({ requests: 3, errors: 1 });
    const fresh = record(resumed, { canary: arm(2, 0) }, SPEC, 12, null);
    expect(viewOf(fresh, SPEC).arms.canary.requests).toBe(2);
  });
});
