/**
 * Shared helpers for warmgate benchmarks: closed-loop load, percentiles, tables, JSON.
 */
import { mkdir, readFile, writeFile } from "node:fs/promises";
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

/** Writes a benchmark's JSON result under bench/results/ and returns the path. */
export async function writeResult(name: string, data: unknown): Promise<string> {
  await mkdir(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, `${name}.json`);
  await writeFile(path, JSON.stringify(data, null, 2) + "\n");
  return path;
}

/** Resident set size of a process in bytes (Linux /proc), or null when unknown. */
export async function rssBytes(pid: number): Promise<number | null> {
  try {
    const status = await readFile(`/proc/${pid}/status`, "utf8");
    const match = /VmRSS:\s+(\d+)\s+kB/.exec(status);
    return match?.[1] ? Number(match[1]) * 1024 : null;
  } catch {
    return null;
  }
}

/** Pids of a process and all its descendants (Linux /proc). */
export async function processTree(pid: number): Promise<number[]> {
  const { readdir } = await import("node:fs/promises");
  const parents = new Map<number, number[]>();
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const list = parents.get(ppid) ?? [];
      list.push(Number(entry));
      parents.set(ppid, list);
    } catch {
      // Process ended while listing.
    }
  }
  const out: number[] = [];
  const stack = [pid];
  while (stack.length) {
    const p = stack.pop() as number;
    out.push(p);
    stack.push(...(parents.get(p) ?? []));
  }
  return out;
}

/** RSS of the workerd process(es) under a `wrangler dev` child, in bytes. */
export async function workerdRss(wranglerPid: number): Promise<number | null> {
  let total = 0;
  let found = false;
  for (const pid of await processTree(wranglerPid)) {
    try {
      const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8");
      if (!cmd.includes("workerd")) continue;
    } catch {
      continue;
    }
    const rss = await rssBytes(pid);
    if (rss !== null) {
      total += rss;
      found = true;
    }
  }
  return found ? total : null;
}
