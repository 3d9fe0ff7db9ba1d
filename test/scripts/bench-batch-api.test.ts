import { describe, expect, it } from "vitest";
import { edgeCpuShare } from "../../bench/batch-api-report.ts";

describe("bench:batch-api edge CPU", () => {
  // 10 s at half a core, then 10 s at a full core; the pid changes at 20 s (a restart).
  const samples = [
    ...Array.from({ length: 21 }, (_, s) => ({
      at: s,
      pid: 1,
      cpuMs: s <= 10 ? s * 500 : 5_000 + (s - 10) * 1_000,
    })),
    { at: 21, pid: 2, cpuMs: 0 },
    { at: 22, pid: 2, cpuMs: 250 },
  ];

  it("reads each window's own share of a core", () => {
    expect(edgeCpuShare(samples, (t) => t >= 0 && t <= 10)).toBeCloseTo(0.5);
    expect(edgeCpuShare(samples, (t) => t >= 10 && t <= 20)).toBeCloseTo(1);
    expect(edgeCpuShare(samples, (t) => t <= 5 || (t >= 15 && t <= 20))).toBeCloseTo(0.75);
  });

  it("skips the interval across a restart", () => {
    expect(edgeCpuShare(samples, (t) => t >= 20)).toBeCloseTo(0.25);
  });
});
