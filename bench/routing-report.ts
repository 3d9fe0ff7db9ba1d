/**
 * The report of `npm run bench:routing` (docs/benchmarks.md, "Routing"): the table of
 * every cell, the targets, and the chart of TTFT p90 against request rate per policy and
 * workload, drawn with Vega-Lite as SVG.
 */
import type { TopLevelSpec } from "vega-lite";
import { vegaLiteSvg } from "./vega.ts";
import { fmt, markdownTable } from "./lib.ts";
import type { CellResult } from "./routing-cell.ts";

/** A target of the bench: what it is, what was measured, the goal and whether it was met. */
export interface Target {
  target: string;
  measured: string;
  goal: string;
  met: boolean;
}

/**
 * The kill target over one workload's runs that killed their busiest origin: the streams
 * past their first byte it cut, against 1.3 times an even share of those in flight (in
 * whole streams, at least the even split's busiest: ⌈T/N⌉), summed over the kills; null
 * without a kill.
 */
export function killTarget(runs: readonly CellResult[]): Target | null {
  let cut = 0;
  let streams = 0;
  let bound = 0;
  const each: string[] = [];
  for (const { kill, origins } of runs) {
    if (kill === undefined) continue;
    const streaming = kill.streaming.reduce((a, b) => a + b, 0);
    cut += kill.cut;
    streams += streaming;
    bound += Math.max(Math.ceil(streaming / origins), (1.3 * streaming) / origins);
    each.push(`${kill.cut} of ${kill.streaming.join("+")}`);
  }
  const [one] = runs;
  if (one === undefined || each.length === 0) return null;
  return {
    target:
      `${one.workload}, ${one.origins} origins, ${one.rate}/s: streams past their first byte ` +
      `cut by killing the busiest origin, ${each.length} kills`,
    measured: `${cut} of ${streams} (${each.join(", ")})`,
    goal: `<= ${fmt(bound, 1)} (sum of max(ceil(T/N), 1.3 T/N))`,
    met: cut <= bound,
  };
}

/** One row per cell. */
export function cellsTable(cells: readonly CellResult[]): string {
  return markdownTable(
    [
      "workload",
      "origins",
      "rate/s",
      "policy",
      "hit rate",
      "ceiling",
      "TTFT p50 ms",
      "TTFT p90 ms",
      "tokens/s",
      "max/mean",
      "tokens max/mean",
      "busiest in flight",
      "failures",
    ],
    cells.map((c) => [
      c.workload,
      String(c.origins),
      String(c.rate),
      c.policy,
      fmt(c.hitRate, 3),
      fmt(c.ceiling, 3),
      fmt(c.ttft.p50, 0),
      fmt(c.ttft.p90, 0),
      fmt(c.throughput, 0),
      fmt(c.imbalance, 2),
      fmt(c.decodeImbalance, 2),
      fmt(c.busiestShare, 2),
      String(c.failures),
    ]),
  );
}

/** TTFT p90 against rate, one panel per workload, one line per policy (4 origins). */
export async function ttftChart(cells: readonly CellResult[], origins: number): Promise<string> {
  const values = cells
    .filter((c) => c.origins === origins)
    .map((c) => ({ workload: c.workload, policy: c.policy, rate: c.rate, p90: c.ttft.p90 }));
  const spec: TopLevelSpec = {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    data: { values },
    facet: { column: { field: "workload", type: "nominal", title: null } },
    spec: {
      width: 220,
      height: 200,
      mark: { type: "line", point: true },
      encoding: {
        x: { field: "rate", type: "quantitative", title: "requests per second" },
        y: {
          field: "p90",
          type: "quantitative",
          scale: { type: "log" },
          title: `TTFT p90 (ms), ${origins} origins`,
        },
        color: { field: "policy", type: "nominal", title: null },
      },
    },
    resolve: { scale: { x: "independent" } },
  };
  return vegaLiteSvg(spec);
}
