/**
 * The report of `npm run bench:batching` (docs/benchmarks.md): each phase's samples and
 * counters summed per concurrency and path, and the table the benchmark prints.
 */
import { fmt, markdownTable, summarize, type LatencySummary } from "./lib.ts";

/** Which way requests go: batching off, through the batcher, or asking it every time. */
export type Path = "direct" | "batched" | "asked";

export interface Sample {
  ttft: number;
  total: number;
}

/** One timed stretch of one path at one concurrency. */
export interface Phase {
  path: Path;
  concurrency: number;
  seconds: number;
  samples: Sample[];
  errors: number;
  firstError: string | null;
  calls: number;
  items: number;
  batchSizes: Record<string, number>;
  /** The batcher's window and queue halfway through the phase. */
  midway: { windowMs: number; queued: number; inFlight: number } | null;
  /** Requests that ended in the phase, ramp included, and the edge workerd's CPU meanwhile. */
  ended: number;
  edgeCpuMs: number | null;
}

export interface Row {
  concurrency: number;
  path: Path;
  requests: number;
  errors: number;
  firstError: string | null;
  rps: number;
  ttft: LatencySummary;
  total: LatencySummary;
  /** Upstream HTTP calls per request that reached the origin. */
  callsPerRequest: number;
  meanBatchSize: number;
  batchSizes: Record<string, number>;
  /** CPU time of the edge's workerd per request that ended (ms); NaN when unknown. */
  edgeCpuMsPerRequest: number;
}

/** The phases summed per concurrency and path, in the order of `levels`. */
export function batchingRows(
  phases: readonly Phase[],
  levels: readonly number[],
  pathsAt: (concurrency: number) => Path[],
): Row[] {
  const rows: Row[] = [];
  for (const concurrency of levels) {
    for (const path of pathsAt(concurrency)) {
      const mine = phases.filter((p) => p.path === path && p.concurrency === concurrency);
      const samples = mine.flatMap((p) => p.samples);
      const calls = mine.reduce((n, p) => n + p.calls, 0);
      const items = mine.reduce((n, p) => n + p.items, 0);
      const seconds = mine.reduce((n, p) => n + p.seconds, 0);
      const timed = mine.filter((p) => p.edgeCpuMs !== null);
      const edgeCpuMs = timed.reduce((n, p) => n + (p.edgeCpuMs ?? 0), 0);
      const ended = timed.reduce((n, p) => n + p.ended, 0);
      const batchSizes: Record<string, number> = {};
      for (const phase of mine) {
        for (const [bucket, n] of Object.entries(phase.batchSizes)) {
          batchSizes[bucket] = (batchSizes[bucket] ?? 0) + n;
        }
      }
      rows.push({
        concurrency,
        path,
        requests: samples.length,
        errors: mine.reduce((n, p) => n + p.errors, 0),
        firstError: mine.find((p) => p.firstError !== null)?.firstError ?? null,
        rps: samples.length / seconds,
        ttft: summarize(samples.map((s) => s.ttft)),
        total: summarize(samples.map((s) => s.total)),
        callsPerRequest: items === 0 ? Number.NaN : calls / items,
        meanBatchSize: calls === 0 ? Number.NaN : items / calls,
        batchSizes,
        edgeCpuMsPerRequest: ended === 0 ? Number.NaN : edgeCpuMs / ended,
      });
    }
  }
  return rows;
}

/** The row of a concurrency and path. */
export function rowOf(rows: readonly Row[], concurrency: number, path: Path): Row | undefined {
  return rows.find((r) => r.concurrency === concurrency && r.path === path);
}

const BUCKET_ORDER = ["1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256"];
const sizes = (row: Row) =>
  Object.entries(row.batchSizes)
    .sort(([a], [b]) => BUCKET_ORDER.indexOf(a) - BUCKET_ORDER.indexOf(b))
    .map(([bucket, n]) => `${bucket}: ${n}`)
    .join(", ");

/** The benchmark's table, one line per row. */
export function batchingTable(rows: readonly Row[]): string {
  return markdownTable(
    [
      "clients",
      "path",
      "requests",
      "req/s",
      "edge CPU ms/request",
      "TTFT p50",
      "TTFT p99",
      "+TTFT p50",
      "+TTFT p99",
      "calls/request",
      "batch sizes (calls)",
      "errors",
    ],
    rows.map((r) => {
      const direct = rowOf(rows, r.concurrency, "direct");
      const added = (pick: (s: LatencySummary) => number) =>
        r.path === "direct" || direct === undefined ? "" : fmt(pick(r.ttft) - pick(direct.ttft));
      return [
        String(r.concurrency),
        r.path,
        String(r.requests),
        fmt(r.rps, 0),
        fmt(r.edgeCpuMsPerRequest),
        fmt(r.ttft.p50),
        fmt(r.ttft.p99),
        added((s) => s.p50),
        added((s) => s.p99),
        fmt(r.callsPerRequest, 3),
        r.path === "direct" ? "" : sizes(r),
        String(r.errors),
      ];
    }),
  );
}

/** The benchmark's targets: what batching may cost at 1 client and must save at 500. */
export function batchingTargets(rows: readonly Row[], maxWindowMs: number) {
  const one = { direct: rowOf(rows, 1, "direct"), batched: rowOf(rows, 1, "batched") };
  const many = { direct: rowOf(rows, 500, "direct"), batched: rowOf(rows, 500, "batched") };
  const addedP50At1 = (one.batched?.ttft.p50 ?? Number.NaN) - (one.direct?.ttft.p50 ?? Number.NaN);
  const addedP99At500 =
    (many.batched?.ttft.p99 ?? Number.NaN) - (many.direct?.ttft.p99 ?? Number.NaN);
  const callsAt500 = many.batched?.callsPerRequest ?? Number.NaN;
  return [
    {
      target: "1 client: added TTFT p50 <= 1 ms",
      value: `${fmt(addedP50At1)} ms`,
      met: addedP50At1 <= 1,
    },
    {
      target: "500 clients: <= 1 upstream call per 8 requests",
      value: `1 per ${fmt(1 / callsAt500, 1)}`,
      met: callsAt500 <= 1 / 8,
    },
    {
      target: `500 clients: added TTFT p99 <= the window (${maxWindowMs} ms)`,
      value: `${fmt(addedP99At500)} ms`,
      met: addedP99At500 <= maxWindowMs,
    },
  ];
}
