import { describe, expect, it } from "vitest";
import { originShares } from "../../../functions/observability/collect.ts";

const REPORT = {
  receivedAt: 0,
  running: 12,
  waiting: 3,
  maxNumSeqs: 64,
  kvFreeTokens: 750,
  kvTotalTokens: 1000,
  stepMs: 0,
  prefillTokensPerMs: null,
  prefillBacklogTokens: null,
  prefixQueries: 100,
  prefixHits: 40,
  backgroundRunning: 0,
  backgroundQueued: 0,
  backgroundCap: null,
};

describe("an origin's load as shown", () => {
  it("shows the running and waiting sequences of a fresh report", () => {
    expect(originShares({ ...REPORT, ageMs: 500 }, 1000)).toEqual({
      running: 12,
      waiting: 3,
      kvUsage: 0.25,
      prefixHit: 0.4,
    });
  });

  it("shows none running once the report is older than the load report TTL", () => {
    const shown = originShares({ ...REPORT, ageMs: 1001 }, 1000);
    expect(shown.running).toBe(0);
    expect(shown.waiting).toBe(0);
  });
});
