// Copies uPlot (a dev dependency) into the dashboard's assets, as wrangler's build step;
// writes only what changed, so `wrangler dev` does not rebuild in a loop. docs/metrics.md
import { copyFileSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const from = join(root, "node_modules", "uplot", "dist");
const to = join(root, "dashboard", "public", "vendor");
mkdirSync(to, { recursive: true });
for (const file of ["uPlot.iife.min.js", "uPlot.min.css"]) {
  const source = join(from, file);
  const target = join(to, file);
  if (existsSync(target) && readFileSync(target).equals(readFileSync(source))) continue;
  copyFileSync(source, target);
}
