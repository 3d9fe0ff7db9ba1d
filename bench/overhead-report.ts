/**
 * The tables and targets of `npm run bench:overhead` (bench/overhead.ts): each path's
 * latency, throughput and CPU per request, and warmgate's ratios to the pass-through Worker
 * and to Portkey, each goal scored against its own baseline. See docs/benchmarks.md.
 */
import {
  PATH_COLUMNS,
  fmt,
  markdownTable,
  pathCells,
  type PathResult,
  type TargetResult,
} from "./lib.ts";

/**
 * The paths compared; `warmgate-keys` is the edge again, its requests spread over many keys
 * in turn (`--keys N`).
 */
export type Target = "direct" | "passthrough" | "portkey" | "warmgate" | "warmgate-keys";
/** The workloads: four short-prompt ones, then JSON at one client by prompt size. */
export type Scenario =
  | "json c=1"
  | "json c=32"
  | "stream c=1"
  | "stream c=32"
  | "json c=1 1k"
  | "json c=1 8k"
  | "json c=1 32k";

/** One workload on one path, with its serving process's CPU time per request (ms). */
export interface OverheadRow extends PathResult<Scenario, Target> {
  cpuMsPerRequest: number;
}

/** What each workload is judged by: p50 at one client (time to first byte for streams), req/s at 32. */
function headline(row: OverheadRow): number {
  if (row.scenario.includes("c=32")) return row.rps;
  return row.scenario.startsWith("stream") ? row.ttfb.p50 : row.total.p50;
}

/** warmgate's headline figure over a baseline's, oriented so that above 1 is a loss. */
function lossRatio(rows: OverheadRow[], scenario: Scenario, baseline: Target): number {
  const find = (t: Target) => rows.find((r) => r.scenario === scenario && r.target === t);
  const ours = find("warmgate");
  const theirs = find(baseline);
  if (ours === undefined || theirs === undefined) return Number.NaN;
  const ratio = headline(ours) / headline(theirs);
  return scenario.includes("c=32") ? 1 / ratio : ratio;
}

/** The main table: every path of every workload, with CPU per request and warmgate's loss ratios. */
export function overheadTable(rows: OverheadRow[]): string {
  const direct = (s: Scenario) => rows.find((r) => r.scenario === s && r.target === "direct");
  return markdownTable(
    [...PATH_COLUMNS, "+p50 vs direct", "CPU ms/req", "× passthrough", "× Portkey", "errors"],
    rows.map((r) => [
      ...pathCells(r),
      r.target === "direct" ? "" : fmt(r.total.p50 - (direct(r.scenario)?.total.p50 ?? NaN)),
      fmt(r.cpuMsPerRequest),
      r.target === "warmgate" ? fmt(lossRatio(rows, r.scenario, "passthrough")) : "",
      r.target === "warmgate" ? fmt(lossRatio(rows, r.scenario, "portkey")) : "",
      String(r.errors),
    ]),
  );
}

const PROMPTS: Scenario[] = ["json c=1 1k", "json c=1 8k", "json c=1 32k"];

/** What each path adds over `direct` and spends in CPU, by prompt size (JSON, one client). */
export function promptSizeTable(rows: OverheadRow[]): string {
  const paths = (["passthrough", "portkey", "warmgate"] as const).filter((t) =>
    rows.some((r) => r.target === t),
  );
  const cell = (s: Scenario, t: Target) => {
    const row = rows.find((r) => r.scenario === s && r.target === t);
    const direct = rows.find((r) => r.scenario === s && r.target === "direct");
    if (row === undefined) return "–";
    return `+${fmt(row.total.p50 - (direct?.total.p50 ?? NaN))} ms, ${fmt(row.cpuMsPerRequest)} CPU`;
  };
  return markdownTable(
    ["prompt", ...paths.map((p) => `${p}: +p50, CPU ms/req`)],
    PROMPTS.map((s) => [s.split(" ").at(-1) ?? s, ...paths.map((p) => cell(s, p))]),
  );
}

/** CPU time per request of a path over the four short-prompt workloads together (ms). */
function cpuPerRequest(rows: OverheadRow[], target: Target): number {
  const own = rows.filter((r) => r.target === target && !PROMPTS.includes(r.scenario));
  const requests = own.reduce((n, r) => n + r.total.n, 0);
  return own.reduce((ms, r) => ms + r.cpuMsPerRequest * r.total.n, 0) / requests;
}

/** How much a path's added p50 and CPU per request grow from the 1k to the 31.5k prompt. */
function growth(rows: OverheadRow[], target: Target) {
  const at = (s: Scenario, t: Target) => rows.find((r) => r.scenario === s && r.target === t);
  const added = (s: Scenario) =>
    (at(s, target)?.total.p50 ?? NaN) - (at(s, "direct")?.total.p50 ?? NaN);
  const cpu = (s: Scenario) => at(s, target)?.cpuMsPerRequest ?? NaN;
  return {
    addedMs: added("json c=1 32k") - added("json c=1 1k"),
    cpuRatio: cpu("json c=1 32k") / cpu("json c=1 1k"),
  };
}

const target = (value: number, goal: string, met: boolean): TargetResult => ({
  value,
  target: goal,
  met: Number.isFinite(value) && met,
});

/**
 * The goals, each a ratio to the baseline it is scored against (above 1 a loss for
 * latency and CPU, below 1 a loss for requests/s): within 1.25× the pass-through's p50 at
 * one client, 0.75× its requests/s at 32, 1.8× its CPU; ahead of Portkey on every workload
 * and in CPU; what a 31.5k-token prompt adds over a 1k one, within noise.
 */
export function overheadTargets(
  rows: OverheadRow[],
  withPortkey: boolean,
): Record<string, TargetResult> {
  const ratio = (s: Scenario, t: Target) => {
    const r = lossRatio(rows, s, t);
    return s.includes("c=32") ? 1 / r : r;
  };
  const p50Json = ratio("json c=1", "passthrough");
  const rpsJson = ratio("json c=32", "passthrough");
  const rpsStream = ratio("stream c=32", "passthrough");
  const cpu = cpuPerRequest(rows, "warmgate");
  const cpuFloor = cpu / cpuPerRequest(rows, "passthrough");
  const ours = growth(rows, "warmgate");
  const floor = growth(rows, "passthrough");
  const targets: Record<string, TargetResult> = {
    p50_ratio_vs_passthrough_json_c1: target(p50Json, "<= 1.25", p50Json <= 1.25),
    ttfb_ratio_vs_passthrough_stream_c1: target(
      ratio("stream c=1", "passthrough"),
      "(reported)",
      true,
    ),
    rps_ratio_vs_passthrough_json_c32: target(rpsJson, ">= 0.75", rpsJson >= 0.75),
    rps_ratio_vs_passthrough_stream_c32: target(rpsStream, ">= 0.75", rpsStream >= 0.75),
    cpu_ms_per_request: target(cpu, "(reported)", true),
    cpu_ratio_vs_passthrough: target(cpuFloor, "<= 1.8", cpuFloor <= 1.8),
  };
  if (withPortkey) {
    const vsPortkey = {
      p50_ratio_vs_portkey_json_c1: ratio("json c=1", "portkey"),
      ttfb_ratio_vs_portkey_stream_c1: ratio("stream c=1", "portkey"),
    };
    for (const [name, value] of Object.entries(vsPortkey)) {
      targets[name] = target(value, "< 1", value < 1);
    }
    for (const s of ["json c=32", "stream c=32"] as const) {
      const value = ratio(s, "portkey");
      targets[`rps_ratio_vs_portkey_${s.replace(" c=", "_c")}`] = target(value, "> 1", value > 1);
    }
    const cpuPortkey = cpu / cpuPerRequest(rows, "portkey");
    targets.cpu_ratio_vs_portkey = target(cpuPortkey, "<= 1", cpuPortkey <= 1);
  }
  targets.added_p50_growth_ms_1k_to_32k = target(ours.addedMs, "<= 1", ours.addedMs <= 1);
  targets.passthrough_added_p50_growth_ms_1k_to_32k = target(floor.addedMs, "(the floor)", true);
  targets.cpu_growth_ratio_1k_to_32k = target(ours.cpuRatio, "<= 1.25", ours.cpuRatio <= 1.25);
  targets.passthrough_cpu_growth_ratio_1k_to_32k = target(floor.cpuRatio, "(the floor)", true);
  return targets;
}

/**
 * warmgate's throughput with its requests spread over many keys in turn, relative to one
 * key, at each workload with many clients (null when the run used one key).
 */
export function manyKeysRatios(rows: OverheadRow[]): Record<string, TargetResult> {
  const results: Record<string, TargetResult> = {};
  for (const row of rows.filter(
    (r) => r.target === "warmgate-keys" && r.scenario.includes("c=32"),
  )) {
    const one = rows.find((r) => r.scenario === row.scenario && r.target === "warmgate");
    const value = row.rps / (one?.rps ?? Number.NaN);
    results[`rps_ratio_many_keys_vs_one_${row.scenario.replace(" c=", "_c")}`] = target(
      value,
      "(reported)",
      true,
    );
    const cpu = row.cpuMsPerRequest / (one?.cpuMsPerRequest ?? Number.NaN);
    results[`cpu_ratio_many_keys_vs_one_${row.scenario.replace(" c=", "_c")}`] = target(
      cpu,
      "(reported)",
      true,
    );
  }
  return results;
}
