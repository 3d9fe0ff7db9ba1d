/**
 * Shared helpers for warmgate benchmarks: closed-loop load, percentiles, tables, JSON.
 * See docs/benchmarks.md.
 */
import { execFileSync } from "node:child_process";
import { mkdir, writeFile } from "node:fs/promises";
import { cpus } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** Where benchmark JSON results are written. */
export const RESULTS_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "results");

/** Summary of a set of latency samples, in milliseconds. */
export interface LatencySummary {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  mean: number;
  max: number;
}

/** Nearest-rank percentile of sorted samples. */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank] ?? Number.NaN;
}

/** Summarises latency samples (ms). */
export function summarize(samples: number[]): LatencySummary {
  const sorted = [...samples].sort((a, b) => a - b);
  const sum = sorted.reduce((a, b) => a + b, 0);
  return {
    n: sorted.length,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    mean: sorted.length ? sum / sorted.length : Number.NaN,
    max: sorted.at(-1) ?? Number.NaN,
  };
}

/** Result of one closed-loop run. */
export interface LoadResult {
  requests: number;
  errors: number;
  seconds: number;
  rps: number;
  samples: number[];
}

/**
 * Runs `task` from `concurrency` workers until `requests` have completed, each worker
 * starting its next request as soon as its last one ends (closed loop).
 */
export async function closedLoop(
  concurrency: number,
  requests: number,
  task: (i: number) => Promise<number>,
): Promise<LoadResult> {
  const samples: number[] = [];
  let next = 0;
  let errors = 0;
  const started = performance.now();
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= requests) return;
      try {
        samples.push(await task(i));
      } catch {
        errors++;
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = (performance.now() - started) / 1000;
  return { requests, errors, seconds, rps: (requests - errors) / seconds, samples };
}

/** Formats a number for a table cell. */
export function fmt(value: number, digits = 2): string {
  if (!Number.isFinite(value)) return "–";
  return value.toFixed(digits);
}

const tableLine = (cells: string[]) => `| ${cells.join(" | ")} |`;

/** Renders a GitHub-flavoured Markdown table. */
export function markdownTable(header: string[], rows: string[][]): string {
  const line = tableLine;
  return [line(header), line(header.map(() => "---")), ...rows.map(line)].join("\n");
}

/** A benchmark's figure against its goal; a goal in parentheses is only reported. */
export interface TargetResult {
  value: number;
  target: string;
  met: boolean;
}

/** The table of a benchmark's targets: measured, goal, and whether it was met. */
export function targetsTable(targets: Record<string, TargetResult>): string {
  return markdownTable(
    ["target", "measured", "goal", "met"],
    Object.entries(targets).map(([name, t]) => [
      name,
      fmt(t.value),
      t.target,
      t.target.startsWith("(") ? "" : t.met ? "yes" : "NO",
    ]),
  );
}

/** The command line that ran this benchmark, as a reader would type it. */
export function benchCommand(script: string): string {
  const args = process.argv.slice(2);
  return args.length === 0 ? `npm run ${script}` : `npm run ${script} -- ${args.join(" ")}`;
}

/** Where a result came from: the commit, whether the tree had changes, when, on how many CPUs. */
export interface Provenance {
  commit: string | null;
  dirty: boolean | null;
  date: string;
  cpus: number;
}

// git's answer in this checkout, or null where git fails.
function git(...args: string[]): string | null {
  try {
    return execFileSync("git", args, { cwd: dirname(RESULTS_DIR), encoding: "utf8" }).trim();
  } catch {
    return null;
  }
}

/**
 * The {@link Provenance} of a run in this checkout (git's answers null where git fails). Dirty:
 * a change outside `bench/results/`, where other runs' results change nothing they measure.
 */
export function provenance(): Provenance {
  const status = git("status", "--porcelain", "--", ":(top)", ":(top,exclude)bench/results");
  return {
    commit: git("rev-parse", "HEAD"),
    dirty: status === null ? null : status !== "",
    date: new Date().toISOString(),
    cpus: cpus().length,
  };
}

/** This run's provenance, taken as the benchmark started (its own results dirty the tree). */
const RUN_PROVENANCE = provenance();

/**
 * Sets an origin's injected faults through its admin API (`null` clears them); the answer
 * is read and dropped.
 */
export function setOriginFaults(url: string, adminToken: string, faults: unknown) {
  return fetch(`${url}/admin/faults`, {
    method: faults === null ? "DELETE" : "PUT",
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    ...(faults !== null && { body: JSON.stringify(faults) }),
  }).then((r) => r.arrayBuffer());
}

/**
 * Runs `stop` (the processes a benchmark started) before the process ends on SIGINT,
 * SIGTERM or SIGHUP, then exits 130; answers how to unregister it once stopped normally.
 * The edge runs in its own process group, which a terminal's Ctrl-C never reaches.
 */
export function stopOnSignal(stop: () => Promise<void>): () => void {
  const onSignal = (signal: NodeJS.Signals) => {
    process.stderr.write(`${signal}: stopping what the benchmark started…\n`);
    void stop().finally(() => process.exit(130));
  };
  const signals: NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];
  for (const signal of signals) process.once(signal, onSignal);
  return () => {
    for (const signal of signals) process.off(signal, onSignal);
  };
}

/**
 * Results file name of a benchmark run under `runtime`: the default (workerd) keeps the
 * plain name, others get theirs appended, so one run does not overwrite the other's.
 */
export function resultName(name: string, runtime: string): string {
  return runtime === "workerd" ? name : `${name}-${runtime}`;
}

/**
 * Writes a benchmark's other result file (a chart) under bench/results/; returns the path.
 * An SVG carries the run's provenance in a comment ahead of its root, as JSON does in a field.
 */
export async function writeResultFile(name: string, text: string): Promise<string> {
  await mkdir(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, name);
  const stamp = `<!-- provenance: ${JSON.stringify(RUN_PROVENANCE).replaceAll("--", "- -")} -->\n`;
  await writeFile(path, name.endsWith(".svg") && text.startsWith("<svg") ? stamp + text : text);
  return path;
}

/**
 * Writes a benchmark's JSON result under bench/results/ and returns the path. A result that
 * names no `provenance` gets the run's: the commit, tree and CPUs as the run began.
 */
export async function writeResult(name: string, data: unknown): Promise<string> {
  await mkdir(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, `${name}.json`);
  const stamped =
    typeof data === "object" && data !== null && !Array.isArray(data) && !("provenance" in data)
      ? { provenance: RUN_PROVENANCE, ...data }
      : data;
  await writeFile(path, JSON.stringify(stamped, null, 2) + "\n");
  return path;
}

/** Times of one request: to the first body byte and to the end of the body (ms). */
export interface TimedSample {
  total: number;
  ttfb: number;
}

/** POSTs `payload`, reads the whole body and times it; throws unless a 200 with a body. */
export async function timedRequest(
  url: string,
  headers: Record<string, string>,
  payload: string,
): Promise<TimedSample> {
  const started = performance.now();
  const res = await fetch(url, { method: "POST", headers, body: payload });
  const reader = res.body?.getReader();
  let ttfb = Number.NaN;
  let bytes = 0;
  if (reader) {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (Number.isNaN(ttfb)) ttfb = performance.now() - started;
      bytes += value.byteLength;
    }
  }
  const total = performance.now() - started;
  if (res.status !== 200 || bytes === 0) throw new Error(`status ${res.status}`);
  return { total, ttfb };
}

/** One workload of an alternating comparison. */
export interface Workload<S extends string> {
  name: S;
  stream: boolean;
  concurrency: number;
  requests: number;
}

/** Results of one workload on one path. */
export interface PathResult<S extends string, T extends string> {
  scenario: S;
  target: T;
  total: LatencySummary;
  ttfb: LatencySummary;
  rps: number;
  errors: number;
}

/**
 * Runs every workload on every path, round after round, reversing the order of the paths
 * each round so drift on a shared machine hits all of them alike; warms each path first.
 *
 * A workload of one client runs the paths in turn request by request (each path's
 * requests/s then counts only its own requests' time): each path meets the same moments
 * of a noisy machine, where blocks of a few hundred milliseconds each met their own. A
 * workload of several clients runs each path as a block, since it measures throughput.
 *
 * Every measured stretch starts with `blockWarmRequests` unmeasured requests per path (at
 * least one per client): a path left idle while the others ran answers its first requests
 * slower, most of all the path with the most code.
 */
export async function compareAlternating<S extends string, T extends string>(options: {
  workloads: readonly Workload<S>[];
  targets: readonly T[];
  rounds: number;
  warmRequests: number;
  blockWarmRequests: number;
  send: (target: T, stream: boolean) => Promise<TimedSample>;
}): Promise<PathResult<S, T>[]> {
  const { workloads, targets, rounds, send } = options;
  for (const target of targets) {
    for (const stream of [false, true]) {
      await closedLoop(8, options.warmRequests, () => send(target, stream).then((s) => s.total));
    }
  }
  const key = (s: S, t: T) => `${s}|${t}`;
  const samples = new Map<string, TimedSample[]>();
  const seconds = new Map<string, number>();
  const completed = new Map<string, number>();
  const errors = new Map<string, number>();
  for (let round = 0; round < rounds; round++) {
    for (const workload of workloads) {
      const order = round % 2 === 0 ? targets : targets.toReversed();
      const perRound = Math.ceil(workload.requests / rounds);
      if (workload.concurrency === 1) {
        for (let i = -options.blockWarmRequests; i < perRound; i++) {
          for (const target of order) {
            const k = key(workload.name, target);
            const started = performance.now();
            const sample = await send(target, workload.stream).catch(() => null);
            if (i < 0) continue;
            seconds.set(k, (seconds.get(k) ?? 0) + (performance.now() - started) / 1000);
            if (sample === null) {
              errors.set(k, (errors.get(k) ?? 0) + 1);
              continue;
            }
            const list = samples.get(k) ?? [];
            list.push(sample);
            samples.set(k, list);
            completed.set(k, (completed.get(k) ?? 0) + 1);
          }
        }
        continue;
      }
      for (const target of order) {
        const k = key(workload.name, target);
        const list = samples.get(k) ?? [];
        await closedLoop(
          workload.concurrency,
          Math.max(options.blockWarmRequests, workload.concurrency),
          () => send(target, workload.stream).then((s) => s.total),
        );
        const result = await closedLoop(workload.concurrency, perRound, async () => {
          const sample = await send(target, workload.stream);
          list.push(sample);
          return sample.total;
        });
        samples.set(k, list);
        seconds.set(k, (seconds.get(k) ?? 0) + result.seconds);
        completed.set(k, (completed.get(k) ?? 0) + result.requests - result.errors);
        errors.set(k, (errors.get(k) ?? 0) + result.errors);
      }
    }
    process.stderr.write(`round ${round + 1}/${rounds} done\n`);
  }
  const rows: PathResult<S, T>[] = [];
  for (const workload of workloads) {
    for (const target of targets) {
      const k = key(workload.name, target);
      const list = samples.get(k) ?? [];
      rows.push({
        scenario: workload.name,
        target,
        total: summarize(list.map((s) => s.total)),
        ttfb: summarize(list.map((s) => s.ttfb)),
        rps: (completed.get(k) ?? 0) / (seconds.get(k) ?? 1),
        errors: errors.get(k) ?? 0,
      });
    }
  }
  return rows;
}

/** Leading columns of a path comparison table; {@link pathCells} fills them. */
export const PATH_COLUMNS = [
  "workload",
  "path",
  "p50 ms",
  "p99 ms",
  "TTFB p50",
  "TTFB p99",
  "req/s",
];

/** The {@link PATH_COLUMNS} cells of one result. */
export function pathCells(r: PathResult<string, string>): string[] {
  return [
    r.scenario,
    r.target,
    fmt(r.total.p50),
    fmt(r.total.p99),
    fmt(r.ttfb.p50),
    fmt(r.ttfb.p99),
    fmt(r.rps, 0),
  ];
}
