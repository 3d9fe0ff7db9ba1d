/**
 * The benchmarks' charts (docs/benchmarks.md): a Vega-Lite spec rendered to SVG
 * without a browser.
 */
import * as vega from "vega";
import type { TopLevelSpec } from "vega-lite";
import { compile } from "vega-lite";

/** The SVG of a Vega-Lite chart. */
export async function vegaLiteSvg(spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: "none" });
  return view.toSVG();
}
