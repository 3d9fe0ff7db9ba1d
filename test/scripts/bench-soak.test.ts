import { describe, expect, it } from "vitest";
import { heapBytes, heapGrowth, summarizeHeap } from "../../bench/heap-summary.ts";
import { type MemorySample, soakTargets } from "../../bench/soak-report.ts";

const MB = 1024 * 1024;
/** Readings every 10 s: 60 s idle, `loadSeconds` of load, 130 s after. */
function curve(
  loadSeconds: number,
  rss: (t: number, phase: MemorySample["phase"]) => number,
): MemorySample[] {
  const out: MemorySample[] = [];
  for (let t = 0; t <= 60 + loadSeconds + 130; t += 10) {
    const phase = t < 60 ? "idle" : t < 60 + loadSeconds ? "load" : "after";
    out.push({
      t,
      phase,
      rssBytes: rss(t, phase) * MB,
      anonBytes: (rss(t, phase) - 20) * MB,
      heapBytes: 10 * MB,
      heapTotalBytes: 30 * MB,
    });
  }
  return out;
}

describe("soak targets", () => {
  it("meets both when memory levels off and comes back", () => {
    const samples = curve(600, (t, phase) =>
      phase === "load" ? 100 + Math.min(t - 60, 200) / 4 : 100,
    );
    const { targets, figures } = soakTargets(samples, 300);
    expect(Object.values(targets).every((t) => t.met)).toBe(true);
    expect(figures.idleRssMb).toBe(100);
    expect(figures.settleRssMb).toBe(150);
    // Anonymous memory outside the heap V8 holds: the runtime's own.
    expect(figures.idleV8HeapMb).toBe(30);
    expect(figures.idleNativeMb).toBe(50);
  });

  it("fails growth that never stops, and memory that stays after the load", () => {
    const samples = curve(600, (t, phase) => (phase === "idle" ? 100 : 100 + (t - 60) / 2));
    const { targets, figures } = soakTargets(samples, 300);
    const [growth, back] = Object.values(targets);
    expect(growth?.met).toBe(false);
    expect(back?.met).toBe(false);
    expect(figures.lateSlopeMbPerMin).toBeCloseTo(30, 5);
  });

  it("refuses a run with a missing phase", () => {
    expect(() =>
      soakTargets(
        curve(0, () => 100),
        300,
      ),
    ).toThrow(/no samples/);
  });
});

const snapshot = (nodes: number[]) => ({
  snapshot: {
    meta: {
      node_fields: ["type", "name", "id", "self_size", "edge_count"],
      node_types: [["hidden", "array", "string", "object", "code", "closure"]],
    },
  },
  nodes,
  strings: ["", "Map", "Request", "run"],
});

describe("heap summary", () => {
  it("sums objects by constructor and the rest by node type, and ranks growth", () => {
    const before = summarizeHeap(snapshot([3, 1, 1, 100, 0, 2, 0, 2, 40, 0]));
    const after = summarizeHeap(
      snapshot([3, 1, 1, 100, 0, 3, 1, 3, 500, 0, 3, 1, 4, 300, 0, 2, 0, 5, 40, 0, 5, 3, 6, 8, 0]),
    );
    expect(after.get("Map")).toEqual({ bytes: 900, count: 3 });
    expect(after.get("(string)")).toEqual({ bytes: 40, count: 1 });
    expect(after.get("run")).toEqual({ bytes: 8, count: 1 });
    expect(heapBytes(after)).toBe(948);
    expect(heapGrowth(before, after, 1)).toEqual([
      { kind: "Map", before: 100, after: 900, count: 2 },
    ]);
  });
});
