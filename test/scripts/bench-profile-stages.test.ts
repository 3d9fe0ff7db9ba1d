import { describe, expect, it } from "vitest";
import { type CpuProfile, chargeProfile } from "../../bench/profile-stages.ts";

// Charging a V8 CPU profile to a request's stages (docs/benchmarks.md, "Where one
// request's CPU goes"): a sample lasts until the next one, a long gap is not its function's.
const frame = (functionName: string, lineNumber: number) => ({
  functionName,
  scriptId: "6",
  url: "index.js",
  lineNumber,
});
const profile: CpuProfile = {
  nodes: [
    { id: 1, callFrame: frame("(root)", -1), children: [2, 3] },
    { id: 2, callFrame: frame("validate", 10) },
    { id: 3, callFrame: frame("countAnswer", 30) },
  ],
  // validate runs four samples; countAnswer is the last before the thread parks for 9 ms.
  samples: [2, 2, 2, 2, 3, 2],
  timeDeltas: [0, 100, 100, 100, 100, 9_000, 100],
};
const ranges = new Map([
  [
    "6",
    [
      { line: 0, module: "functions/request/json-body.ts" },
      { line: 20, module: "functions/middleware/answer-count.ts" },
    ],
  ],
]);

describe("a profile's charges", () => {
  it("charge a sample up to four median spacings and a longer gap to no stage", () => {
    const charged = chargeProfile(profile, ranges);
    const self = new Map(charged.functions.map(([name, , ms]) => [name, ms]));
    expect(self.get("validate")).toBeCloseTo(0.5, 6);
    expect(self.get("countAnswer")).toBeCloseTo(0.4, 6);
    expect(charged.capMs).toBeCloseTo(0.4, 6);
    expect(charged.gapMs).toBeCloseTo(8.6, 6);
    expect(charged.busyMs).toBeCloseTo(0.9, 6);
  });
});
