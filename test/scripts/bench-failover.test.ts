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
    const target = targetsOf(seconds, "a", 2, 2_000).find((t) =>
      t.target.startsWith("requests sent"),
    );
    expect(target).toMatchObject({ measured: "5", met: false });
  });

  it("counts an arm with breakers from the second after the one it was seen open in", () => {
    const seconds = [
      second(10, "dead", 7),
      second(11, "dead", 1, { breaker: "open" }),
      second(12, "dead", 0, { breaker: "open" }),
    ];
    const target = targetsOf(seconds, "a", 2, 2_000).find((t) =>
      t.target.startsWith("requests sent"),
    );
    expect(target).toMatchObject({ measured: "0", met: true });
  });
});

function recovery(seconds: Second[]) {
  return targetsOf(seconds, "a", 2, 2_000).find((t) => t.target.startsWith("seconds from"));
}

describe("the failover bench's recovery target", () => {
  it("counts from the start of the second it came back in to the end of the one it took its share in", () => {
    const twenty = { latencies: Array.from({ length: 20 }, () => 10) };
    const seconds = [
      second(29, "dead", 0, { next: "back" }),
      second(30, "back", 0),
      second(31, "back", 3, twenty),
      second(32, "back", 9, twenty),
    ];
    expect(recovery(seconds)).toMatchObject({ measured: "4 s", met: true });
    // A phase that began on a second's edge counts from that second.
    expect(recovery(seconds.slice(1))).toMatchObject({ measured: "3 s", met: true });
    const slower = [
      ...seconds.slice(0, 3),
      second(32, "back", 4, twenty),
      second(33, "back", 9, twenty),
    ];
    expect(recovery(slower)).toMatchObject({ measured: "5 s", met: false });
  });

  it("fails an arm whose origin takes nothing within the phase, or too late", () => {
    const never = [30, 31, 32, 33, 34, 35].map((at) => second(at, "back", 0));
    expect(recovery(never)).toMatchObject({
      measured: "not within the back phase (6 s)",
      met: false,
    });
    const late = [...never, second(36, "back", 1)];
    expect(recovery(late)).toMatchObject({ measured: "7 s", met: false });
  });
});
