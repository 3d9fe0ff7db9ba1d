/**
 * The chart of `npm run bench:failover` (docs/benchmarks.md, "Failover"), drawn with
 * Vega-Lite as SVG: per second and per arm, the p99 latency, the client-visible errors and
 * the requests sent to the sick origin, with the phases of the timeline marked.
 */
import type { TopLevelSpec } from "vega-lite";
import { vegaLiteSvg } from "./vega.ts";
import type { Second } from "./failover-report.ts";
import { summarize } from "./lib.ts";

export async function failoverChart(seconds: readonly Second[]): Promise<string> {
  const values = seconds.flatMap((s) => {
    const base = { second: s.at, arm: s.arm, phase: s.phase };
    return [
      { ...base, measure: "p99 latency (ms)", value: summarize(s.latencies).p99 || null },
      { ...base, measure: "client-visible errors", value: s.errors },
      { ...base, measure: "requests to the sick origin", value: s.toSick },
    ];
  });
  const spec: TopLevelSpec = {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    data: { values },
    facet: { row: { field: "measure", type: "nominal", title: null } },
    spec: {
      width: 720,
      height: 160,
      layer: [
        {
          mark: { type: "text", baseline: "top", dy: 2, fontSize: 9, color: "#666" },
          transform: [
            { filter: "datum.arm === 'breakers'" },
            { aggregate: [{ op: "min", field: "second", as: "start" }], groupby: ["phase"] },
          ],
          encoding: {
            x: { field: "start", type: "quantitative" },
            y: { value: 0 },
            text: { field: "phase" },
          },
        },
        {
          mark: { type: "line", point: { size: 12 } },
          encoding: {
            x: { field: "second", type: "quantitative", title: "second of the run" },
            y: { field: "value", type: "quantitative", title: null },
            color: { field: "arm", type: "nominal", title: null },
          },
        },
      ],
    },
    resolve: { scale: { y: "independent" } },
  };
  return vegaLiteSvg(spec);
}
