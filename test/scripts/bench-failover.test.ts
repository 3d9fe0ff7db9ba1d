import { describe, expect, it } from "vitest";
import { type Second, phaseAt, targetsOf } from "../../bench/failover-report.ts";

describe("the failover bench's seconds", () => {
  const starts = [
    { name: "healthy" as const, at: 0 },
    { name: "errors" as const, at: 6_040 },
  ];

  it("are labelled by the fault in force when the second began", () => {
    expect(phaseAt(starts, 6_000)).toBe("healthy");
    expect(phaseAt(starts, 7_000)).toBe("errors");
  });
});

function second(
  at: number,
  phase: Second["phase"],
  toSick: number,
  extra: Partial<Second> = {},
): Second {
  return {
    at,
    phase,
    arm: "a",
    latencies: [10],
    errors: 0,
    toSick,
    breaker: null,
    ...extra,
  };
}

describe("the failover bench's dead-origin target", () => {
  it("counts an arm without breakers from 1 s after the death, leaving out the second it came back in", () => {
    const seconds = [
      second(9, "thawed", 4),
      second(10, "dead", 7),
      second(11, "dead", 5),
      second(12, "dead", 6, { next: "back" }),
    ];
    const target = targetsOf(seconds, "a", 2).find((t) => t.target.startsWith("requests sent"));
    expect(target).toMatchObject({ measured: "5", met: false });
  });

  it("counts an arm with breakers from the second after the one it was seen open in", () => {
    const seconds = [
      second(10, "dead", 7),
      second(11, "dead", 1, { breaker: "open" }),
      second(12, "dead", 0, { breaker: "open" }),
    ];
    const target = targetsOf(seconds, "a", 2).find((t) => t.target.startsWith("requests sent"));
    expect(target).toMatchObject({ measured: "0", met: true });
  });
});
