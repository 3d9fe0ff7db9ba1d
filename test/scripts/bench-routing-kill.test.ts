import { describe, expect, it } from "vitest";
import type { CellResult, KillResult } from "../../bench/routing-cell.ts";
import { killTarget } from "../../bench/routing-report.ts";

function run(kill: KillResult | undefined, origins = 4): CellResult {
  return { workload: "agents", origins, rate: 8, kill } as CellResult;
}

function killed(streaming: number[], cut: number): KillResult {
  return { origin: "o0", streaming, inFlight: streaming, cut, failedOver: 0 };
}

describe("the routing bench's kill target", () => {
  it("allows 1.3 times an even share of the streams in flight, summed over the kills", () => {
    // 12 and 8 streams over 4 origins: 3.9 and 2.6 of them.
    const target = killTarget([run(killed([3, 3, 3, 3], 3)), run(killed([2, 2, 2, 2], 3))]);
    expect(target?.met).toBe(true);
    expect(target?.measured).toBe("6 of 20 (3 of 3+3+3+3, 3 of 2+2+2+2)");
    expect(killTarget([run(killed([5, 3, 2, 2], 5)), run(killed([4, 2, 1, 1], 4))])?.met).toBe(
      false,
    );
  });

  it("allows the even split's busiest where the streams do not divide evenly", () => {
    // 5 streams over 4 origins: some origin carries 2, above 1.3 × 5/4.
    expect(killTarget([run(killed([2, 1, 1, 1], 2))])?.met).toBe(true);
    expect(killTarget([run(killed([3, 1, 1, 0], 3))])?.met).toBe(false);
  });

  it("has nothing to score without a kill", () => {
    expect(killTarget([run(undefined)])).toBeNull();
    expect(killTarget([])).toBeNull();
  });
});
