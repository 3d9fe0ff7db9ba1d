/**
 * The arithmetic of `bench:soak` (docs/benchmarks.md, "Memory over a long run"): from memory
 * samples taken before, during and after a steady load, whether growth stopped and whether
 * memory came back. Pure, so a test can feed it known curves.
 */
import type { TargetResult } from "./lib.ts";

export type SoakPhase = "idle" | "load" | "after";

/**
 * One reading: seconds since the run began, the phase, workerd's RSS (and its anonymous
 * part: the allocator's heap and V8's), the JS heap used and the heap V8 holds for it.
 */
export interface MemorySample {
  t: number;
  phase: SoakPhase;
  rssBytes: number;
  anonBytes: number;
  heapBytes: number;
  heapTotalBytes: number;
}

const MB = 1024 * 1024;

/** Least-squares slope of `y` over `t`, per minute. */
function slopePerMinute(points: { t: number; y: number }[]): number {
  if (points.length < 2) return 0;
  const n = points.length;
  const mt = points.reduce((s, p) => s + p.t, 0) / n;
  const my = points.reduce((s, p) => s + p.y, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of points) {
    num += (p.t - mt) * (p.y - my);
    den += (p.t - mt) ** 2;
  }
  return den === 0 ? 0 : (num / den) * 60;
}

export interface SoakFigures {
  idleRssMb: number;
  settleRssMb: number;
  peakAfterSettleRssMb: number;
  endOfLoadRssMb: number;
  afterRssMb: number;
  lateSlopeMbPerMin: number;
  idleHeapMb: number;
  endOfLoadHeapMb: number;
  afterHeapMb: number;
  /** The heap V8 holds (used or not), idle and after the load. */
  idleV8HeapMb: number;
  afterV8HeapMb: number;
  /** Anonymous memory outside V8's heap: the runtime's allocator (buffers, SQLite, …). */
  idleNativeMb: number;
  afterNativeMb: number;
}

/**
 * Figures and targets. `settleSeconds` is how long into the load growth may go on (five
 * minutes in the full run); the growth after it must stay within 10% of the level then, and
 * the last reading after the load within 20% of the idle level.
 */
export function soakTargets(
  samples: MemorySample[],
  settleSeconds: number,
): { figures: SoakFigures; targets: Record<string, TargetResult> } {
  const phase = (p: SoakPhase) => samples.filter((s) => s.phase === p);
  const idle = phase("idle");
  const load = phase("load");
  const after = phase("after");
  const first = load[0];
  const lastIdle = idle.at(-1);
  const lastLoad = load.at(-1);
  const lastAfter = after.at(-1);
  if (!first || !lastIdle || !lastLoad || !lastAfter) throw new Error("a phase has no samples");
  const settleAt = first.t + settleSeconds;
  const settled = load.filter((s) => s.t >= settleAt);
  const settle = settled[0] ?? lastLoad;
  const peak = Math.max(...settled.map((s) => s.rssBytes), settle.rssBytes);
  const figures: SoakFigures = {
    idleRssMb: lastIdle.rssBytes / MB,
    settleRssMb: settle.rssBytes / MB,
    peakAfterSettleRssMb: peak / MB,
    endOfLoadRssMb: lastLoad.rssBytes / MB,
    afterRssMb: lastAfter.rssBytes / MB,
    lateSlopeMbPerMin: slopePerMinute(settled.map((s) => ({ t: s.t, y: s.rssBytes / MB }))),
    idleHeapMb: lastIdle.heapBytes / MB,
    endOfLoadHeapMb: lastLoad.heapBytes / MB,
    afterHeapMb: lastAfter.heapBytes / MB,
    idleV8HeapMb: lastIdle.heapTotalBytes / MB,
    afterV8HeapMb: lastAfter.heapTotalBytes / MB,
    idleNativeMb: (lastIdle.anonBytes - lastIdle.heapTotalBytes) / MB,
    afterNativeMb: (lastAfter.anonBytes - lastAfter.heapTotalBytes) / MB,
  };
  const growth = peak / settle.rssBytes;
  const back = lastAfter.rssBytes / lastIdle.rssBytes;
  const minutes = Math.round(settleSeconds / 6) / 10;
  return {
    figures,
    targets: {
      [`RSS after ${minutes} min of load: peak over the rest / level then`]: {
        value: growth,
        target: "<= 1.10",
        met: growth <= 1.1,
      },
      "RSS after the load / idle RSS": { value: back, target: "<= 1.20", met: back <= 1.2 },
      "JS heap after the load / idle JS heap": {
        value: lastAfter.heapBytes / lastIdle.heapBytes,
        target: "(reported)",
        met: true,
      },
    },
  };
}
