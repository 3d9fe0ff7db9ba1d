/**
 * The report of `npm run bench:streams` (docs/benchmarks.md, "Streams under load"): each
 * phase's streams summed per stream count and path, set against the origin read directly
 * (and their CPU against the pass-through's), the table the benchmark prints, and its targets.
 */
import { fmt, markdownTable, percentile, type TargetResult } from "./lib.ts";
import type { StreamSample } from "./streams-client.ts";

/**
 * Which way a stream goes: the origin itself, a bare pass-through Worker, the edge with
 * batching off, or the Batcher.
 */
export type StreamPath = "origin" | "passthrough" | "edge" | "batcher";

/** One timed stretch of one path at one stream count. */
export interface StreamPhase {
  path: StreamPath;
  streams: number;
  seconds: number;
  samples: StreamSample[];
  errors: number;
  firstError: string | null;
  /** CPU time of the path's workerd meanwhile (ms); null for the origin or when unknown. */
  edgeCpuMs: number | null;
  /** The Batcher's token holds meanwhile (its `counters.holds`); null off the Batcher. */
  holds: number | null;
}

export interface StreamRow {
  streams: number;
  path: StreamPath;
  completed: number;
  errors: number;
  firstError: string | null;
  tokensPerRead: number;
  gapP50Ms: number;
  gapP99Ms: number;
  ttftP50Ms: number;
  /** TTFT p50 over the origin's at the same stream count (ms). */
  ttftAddedMs: number;
  tokensPerSecond: number;
  /** Tokens/s over the origin's at the same stream count. */
  throughputRatio: number;
  /** Read-gap p99 over the origin's at the same stream count. */
  gapP99Ratio: number;
  /** Its workerd's CPU per completed stream (ms); NaN on the origin or when unknown. */
  edgeCpuMsPerStream: number;
  /** That CPU over the pass-through's at the same stream count. */
  cpuRatio: number;
  holds: number | null;
}

/** The phases summed per stream count and path, each set against the origin's. */
export function streamRows(
  phases: readonly StreamPhase[],
  levels: readonly number[],
  paths: readonly StreamPath[],
): StreamRow[] {
  const rows: StreamRow[] = [];
  for (const streams of levels) {
    const sums = paths.map((path) => {
      const mine = phases.filter((p) => p.path === path && p.streams === streams);
      const samples = mine.flatMap((p) => p.samples);
      const tokens = samples.reduce((sum, s) => sum + s.tokens, 0);
      const reads = samples.reduce((sum, s) => sum + s.tokenReads, 0);
      const gaps = samples.flatMap((s) => s.gapsMs).sort((a, b) => a - b);
      const ttfts = samples.map((s) => s.ttftMs).sort((a, b) => a - b);
      const seconds = mine.reduce((sum, p) => sum + p.seconds, 0);
      const cpu = mine.map((p) => p.edgeCpuMs);
      const holds = mine.map((p) => p.holds);
      return {
        path,
        completed: samples.length,
        errors: mine.reduce((sum, p) => sum + p.errors, 0),
        firstError: mine.find((p) => p.firstError !== null)?.firstError ?? null,
        tokensPerRead: tokens / reads,
        gapP50Ms: percentile(gaps, 50),
        gapP99Ms: percentile(gaps, 99),
        ttftP50Ms: percentile(ttfts, 50),
        tokensPerSecond: tokens / seconds,
        edgeCpuMsPerStream: cpu.includes(null)
          ? Number.NaN
          : cpu.reduce((sum: number, ms) => sum + (ms ?? 0), 0) / samples.length,
        holds: holds.includes(null) ? null : holds.reduce((sum: number, n) => sum + (n ?? 0), 0),
      };
    });
    const origin = sums.find((s) => s.path === "origin");
    const floor = sums.find((s) => s.path === "passthrough");
    for (const sum of sums) {
      rows.push({
        streams,
        ...sum,
        cpuRatio: sum.edgeCpuMsPerStream / (floor?.edgeCpuMsPerStream ?? Number.NaN),
        ttftAddedMs: sum.ttftP50Ms - (origin?.ttftP50Ms ?? Number.NaN),
        throughputRatio: sum.tokensPerSecond / (origin?.tokensPerSecond ?? Number.NaN),
        gapP99Ratio: sum.gapP99Ms / (origin?.gapP99Ms ?? Number.NaN),
      });
    }
  }
  return rows;
}

/** The table the benchmark prints. */
export function streamsTable(rows: readonly StreamRow[]): string {
  return markdownTable(
    [
      "streams",
      "path",
      "streams done",
      "tokens/read",
      "read gap p50 ms",
      "read gap p99 ms",
      "gap p99 / origin",
      "TTFT p50 ms",
      "TTFT added ms",
      "tokens/s",
      "tokens/s / origin",
      "CPU ms/stream",
      "CPU / passthrough",
      "holds",
      "errors",
    ],
    rows.map((r) => [
      String(r.streams),
      r.path,
      String(r.completed),
      fmt(r.tokensPerRead),
      fmt(r.gapP50Ms, 1),
      fmt(r.gapP99Ms, 1),
      r.path === "origin" ? "" : `${fmt(r.gapP99Ratio)}×`,
      fmt(r.ttftP50Ms, 1),
      r.path === "origin" ? "" : fmt(r.ttftAddedMs, 1),
      fmt(r.tokensPerSecond, 0),
      r.path === "origin" ? "" : `${fmt(r.throughputRatio)}×`,
      fmt(r.edgeCpuMsPerStream),
      r.path === "origin" || r.path === "passthrough" ? "" : `${fmt(r.cpuRatio)}×`,
      r.holds === null ? "" : String(r.holds),
      String(r.errors),
    ]),
  );
}

/**
 * The goals: through the Batcher at 8 streams at most 1.2 tokens per read and a read-gap
 * p99 within 1.5× the origin's; at 64 streams at least 0.9× the origin's tokens/s. The
 * first-token time the Batcher adds at one stream, and each path's CPU per stream over the
 * pass-through's (bench:overhead holds the CPU goals), are reported alongside.
 */
export function streamTargets(rows: readonly StreamRow[]): Record<string, TargetResult> {
  const at = (streams: number) => rows.find((r) => r.path === "batcher" && r.streams === streams);
  const eight = at(8);
  const sixtyFour = at(64);
  const one = at(1);
  const perRead = eight?.tokensPerRead ?? Number.NaN;
  const gapRatio = eight?.gapP99Ratio ?? Number.NaN;
  const throughput = sixtyFour?.throughputRatio ?? Number.NaN;
  return {
    "batcher tokens per read, 8 streams": { value: perRead, target: "<= 1.2", met: perRead <= 1.2 },
    "batcher read-gap p99 / origin, 8 streams": {
      value: gapRatio,
      target: "<= 1.5",
      met: gapRatio <= 1.5,
    },
    "batcher tokens/s / origin, 64 streams": {
      value: throughput,
      target: ">= 0.9",
      met: throughput >= 0.9,
    },
    "batcher TTFT added ms, 1 stream": {
      value: one?.ttftAddedMs ?? Number.NaN,
      target: "(reported)",
      met: true,
    },
    "batcher edge CPU ms/stream, 64 streams": {
      value: sixtyFour?.edgeCpuMsPerStream ?? Number.NaN,
      target: "(reported)",
      met: true,
    },
    "edge CPU per stream / pass-through's, 1 stream": {
      value: rows.find((r) => r.path === "edge" && r.streams === 1)?.cpuRatio ?? Number.NaN,
      target: "(reported)",
      met: true,
    },
    "batcher CPU per stream / pass-through's, 64 streams": {
      value: sixtyFour?.cpuRatio ?? Number.NaN,
      target: "(reported)",
      met: true,
    },
  };
}
