/**
 * The chart of `npm run bench:batch-api` (docs/benchmarks.md, "Batch API"), drawn with
 * Vega-Lite as SVG: each origin's running sequences over its slots per second of the run,
 * with the phases marked (alone, batch, edge killed, edge back, batch done and alone
 * again).
 */
import type { TopLevelSpec } from "vega-lite";
import type { LoadSample } from "./batch-api-report.ts";
import { vegaLiteSvg } from "./vega.ts";

/** Utilisation of each origin's slots per second of the run, with the phases marked. */
export async function utilisationChart(
  load: readonly LoadSample[],
  phases: Record<string, number>,
  slots: number,
): Promise<string> {
  const buckets = new Map<string, { second: number; origin: string; sum: number; n: number }>();
  for (const s of load) {
    const second = Math.floor(s.at);
    const key = `${s.origin}@${second}`;
    const b = buckets.get(key) ?? { second, origin: s.origin, sum: 0, n: 0 };
    b.sum += s.running / slots;
    b.n += 1;
    buckets.set(key, b);
  }
  const values = [...buckets.values()].map((b) => ({
    second: b.second,
    origin: b.origin,
    utilisation: b.sum / b.n,
  }));
  const marks = [
    ["alone", phases["aloneFrom"]],
    ["batch", phases["batchFrom"]],
    ["edge killed", phases["killedAt"]],
    ["edge back", phases["backAt"]],
    ["batch done, alone again", phases["batchTo"]],
  ].flatMap(([label, second]) => (second === undefined ? [] : [{ label, second }]));
  const spec: TopLevelSpec = {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    width: 760,
    height: 260,
    layer: [
      {
        data: { values },
        mark: { type: "line", interpolate: "step-after" },
        encoding: {
          x: { field: "second", type: "quantitative", title: "second of the run" },
          y: {
            field: "utilisation",
            type: "quantitative",
            title: "running sequences / slots",
            scale: { domain: [0, 1] },
            axis: { format: "%" },
          },
          color: { field: "origin", type: "nominal", title: null },
        },
      },
      {
        data: { values: marks },
        mark: { type: "rule", strokeDash: [4, 3], color: "#888" },
        encoding: { x: { field: "second", type: "quantitative" } },
      },
      {
        data: { values: marks },
        mark: { type: "text", align: "left", dx: 3, dy: -4, fontSize: 10, color: "#555" },
        encoding: {
          x: { field: "second", type: "quantitative" },
          y: { value: 0 },
          text: { field: "label" },
        },
      },
    ],
  };
  return vegaLiteSvg(spec);
}
