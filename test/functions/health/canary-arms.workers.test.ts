import { describe, expect, it } from "vitest";
import type { RegionConfig } from "../../../contracts/config/regions.ts";
import {
  type CanaryPlan,
  armCandidates,
  armFirstAvoids,
} from "../../../functions/health/canaries.ts";
import type { RegionOrigin } from "../../../functions/delivery/origin-pool.ts";

// Which origins each arm of a canary tries, in order (docs/failover.md, "Canaries").
const region = {
  id: "us",
  origins: [{ id: "base-1" }, { id: "canary-1" }, { id: "base-2" }],
} as RegionConfig;
const ranked = ["base-1", "canary-1", "base-2"].map(
  (id) => ({ region, origin: { id } }) as RegionOrigin,
);
const busy = (id: string) => id === "canary-1";
const none = () => false;
const ids = (candidates: readonly RegionOrigin[]) => candidates.map((c) => c.origin.id);
const plan = (arm: CanaryPlan["arm"]) =>
  ({ arm, pool: new Set(["canary-1"]), spec: {} }) as unknown as CanaryPlan;

describe("a canary's arms", () => {
  it("send the canary arm to the pool first and the baseline arm to the baseline alone", () => {
    expect(ids(armCandidates(plan("canary"), ranked, none))).toEqual([
      "canary-1",
      "base-1",
      "base-2",
    ]);
    expect(ids(armCandidates(plan("baseline"), ranked, none))).toEqual(["base-1", "base-2"]);
  });

  it("send the canary arm to the baseline while the pool is refused busy, the pool after it", () => {
    // The isolate ranks an origin refused busy after the others (OriginHealth.rank).
    const busyLast = [ranked[0], ranked[2], ranked[1]] as RegionOrigin[];
    expect(ids(armCandidates(plan("canary"), busyLast, busy))).toEqual([
      "base-1",
      "base-2",
      "canary-1",
    ]);
    // Before, the pool went first all the same: a refusal and a retry on every request.
    expect(ids(armCandidates(plan("canary"), busyLast, none))[0]).toBe("canary-1");
  });

  it("keep a Batcher's first pick on the side the canary arm put first", () => {
    const canary = plan("canary");
    expect(armFirstAvoids(canary, armCandidates(canary, ranked, busy))).toEqual(["canary-1"]);
    expect(armFirstAvoids(canary, armCandidates(canary, ranked, none))).toEqual([
      "base-1",
      "base-2",
    ]);
    expect(armFirstAvoids(plan("baseline"), ranked)).toEqual([]);
  });
});
