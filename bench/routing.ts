/**
 * `npm run bench:routing` (docs/benchmarks.md, "Routing"): round-robin, least-loaded, a
 * prefix-hash ring and warmgate's router on simulated origins (the real origin server and
 * simulated engine), over four workloads at three request rates with 4 origins and at the
 * top rate with 8; two routers that share nothing on one workload; and the 40 × 6 prompts
 * of 4,000 tokens through the real edge with routing on and off. Prints tables and writes
 * bench/results/routing.json and routing.svg. `--quick`: fewer cells, for a smoke run.
 */
import { parseArgs } from "node:util";
import type { RoutingConfig } from "../durable-objects/batcher/settings.ts";
import { benchCommand, fmt, markdownTable, writeResult, writeResultFile } from "./lib.ts";
import { type EdgeRun, runThroughEdge } from "./routing-edge.ts";
import { cellsTable, ttftChart } from "./routing-report.ts";
import { type CellResult, POLICIES, type PolicyName, runCell } from "./routing-sim.ts";
import { type Workload, hotPrefix, multiTurn, sharedPrefix, uniform } from "./routing-workloads.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    "time-scale": { type: "string", default: "0.5" },
    "no-edge": { type: "boolean", default: false },
    /** The router's `routing` settings as JSON, to try others than the defaults. */
    routing: { type: "string" },
  },
});
const timeScale = Number(args["time-scale"]);
const routing =
  args.routing === undefined ? undefined : (JSON.parse(args.routing) as RoutingConfig);

/**
 * Each workload with its request rates at 4 origins; at 8 the workload and the top rate
 * double (twice the groups, sessions, hot prefixes or requests), so that each origin has as
 * much to hold and to do.
 */
function matrix(scale: number): { workload: Workload; rates: number[] }[] {
  return [
    { workload: sharedPrefix(24 * scale, 20), rates: [15, 30, 45].map((r) => r * scale) },
    { workload: multiTurn(64 * scale, 12, 2_000), rates: [8, 16, 32].map((r) => r * scale) },
    { workload: hotPrefix(480 * scale, 2 * scale), rates: [30, 60, 90].map((r) => r * scale) },
    { workload: uniform(480 * scale), rates: [20, 40, 60].map((r) => r * scale) },
  ];
}
const MATRIX = matrix(1);
const WIDE = matrix(2);

const cells: CellResult[] = [];
async function cell(workload: Workload, policy: PolicyName, origins: number, rate: number) {
  const result = await runCell({ workload, policy, origins, rate, timeScale, routing });
  cells.push(result);
  console.error(
    `${workload.name} ${origins} origins ${rate}/s ${policy}: hit ${fmt(result.hitRate, 3)}, ` +
      `TTFT p90 ${fmt(result.ttft.p90, 0)} ms`,
  );
  return result;
}

for (const [at, { workload, rates }] of MATRIX.entries()) {
  const used = args.quick ? rates.slice(-1) : rates;
  for (const rate of used) for (const policy of POLICIES) await cell(workload, policy, 4, rate);
  const wide = WIDE[at];
  if (!args.quick && wide !== undefined) {
    const top = wide.rates.at(-1) ?? 0;
    for (const policy of POLICIES) await cell(wide.workload, policy, 8, top);
  }
}
const [shared] = MATRIX;
if (shared === undefined) throw new Error("no workloads");
const twoEdges = await runCell({
  workload: shared.workload,
  policy: "warmgate",
  origins: 4,
  rate: shared.rates[1] ?? 20,
  timeScale,
  edges: 2,
  routing,
});
const edgeRuns: EdgeRun[] = args["no-edge"]
  ? []
  : [await runThroughEdge(false), await runThroughEdge(true)];

const find = (workload: string, policy: string, origins: number, rate: number) =>
  cells.find(
    (c) =>
      c.workload === workload && c.policy === policy && c.origins === origins && c.rate === rate,
  );
const targets: { target: string; measured: string; goal: string; met: boolean }[] = [];
for (const { workload, rates } of MATRIX) {
  const name = workload.name;
  const top = rates.at(-1) ?? 0;
  const sizes: [number, number][] = args.quick
    ? [[4, top]]
    : [
        [4, top],
        [8, top * 2],
      ];
  for (const [origins, rate] of sizes) {
    const ours = find(name, "warmgate", origins, rate);
    if (ours === undefined) continue;
    if (name === "shared-prefix" || name === "multi-turn") {
      const share = ours.hitRate / ours.ceiling;
      targets.push({
        target: `${name}, ${origins} origins, ${rate}/s: hit rate / ceiling`,
        measured: `${fmt(ours.hitRate, 3)} / ${fmt(ours.ceiling, 3)} = ${fmt(share, 3)}`,
        goal: ">= 0.95",
        met: share >= 0.95,
      });
      const rr = find(name, "round-robin", origins, rate);
      const ratio = (rr?.ttft.p90 ?? 0) / ours.ttft.p90;
      targets.push({
        target: `${name}, ${origins} origins, ${rate}/s: TTFT p90 round-robin / warmgate`,
        measured: `${fmt(rr?.ttft.p90 ?? Number.NaN, 0)} / ${fmt(ours.ttft.p90, 0)} ms = ${fmt(ratio, 1)}×`,
        goal: ">= 5×",
        met: ratio >= 5,
      });
    } else {
      const least = find(name, "least-loaded", origins, rate);
      const ratio = ours.throughput / (least?.throughput ?? Number.NaN);
      targets.push({
        target: `${name}, ${origins} origins, ${rate}/s: throughput / least-loaded's`,
        measured: `${fmt(ours.throughput, 0)} / ${fmt(least?.throughput ?? Number.NaN, 0)} = ${fmt(ratio, 3)}`,
        goal: ">= 0.95",
        met: ratio >= 0.95,
      });
    }
  }
}
targets.push({
  target: `two routers sharing nothing agree (shared-prefix, ${twoEdges.rate}/s)`,
  measured: fmt(twoEdges.agreement ?? 0, 3),
  goal: ">= 0.95",
  met: (twoEdges.agreement ?? 0) >= 0.95,
});
const routed = edgeRuns.find((run) => run.routing);
if (routed !== undefined) {
  const share = routed.hitRate / routed.ceiling;
  targets.push({
    target: "through the edge, 4 origins, 40 × 6 prompts: hit rate / ceiling",
    measured: `${fmt(routed.hitRate, 3)} / ${fmt(routed.ceiling, 3)} = ${fmt(share, 3)}`,
    goal: ">= 0.9",
    met: share >= 0.9,
  });
  const least = Math.min(...routed.shares);
  targets.push({
    target: "through the edge: smallest share of requests an origin served",
    measured: fmt(least, 3),
    goal: ">= 0.125 (half an even share)",
    met: least >= 0.125,
  });
}

const command = benchCommand("bench:routing");
console.log(`\n## Routing (\`${command}\`, time scale ${timeScale}; times in engine ms)\n`);
console.log(cellsTable(cells));
console.log(
  `\nTwo routers sharing nothing, shared-prefix at ${twoEdges.rate}/s: agreement ` +
    `${fmt(twoEdges.agreement ?? 0, 3)}, hit rate ${fmt(twoEdges.hitRate, 3)} of ${fmt(twoEdges.ceiling, 3)}.`,
);
if (edgeRuns.length > 0) {
  console.log("\nThrough the edge (`npm start`-style stack, 4 origins, concurrency 8):\n");
  console.log(
    markdownTable(
      ["routing", "hit rate", "ceiling", "requests per origin", "TTFT p50 ms", "TTFT p90 ms"],
      edgeRuns.map((run) => [
        run.routing ? "on" : "off",
        fmt(run.hitRate, 3),
        fmt(run.ceiling, 3),
        run.perOrigin.join(" / "),
        fmt(run.ttft.p50, 0),
        fmt(run.ttft.p90, 0),
      ]),
    ),
  );
}
console.log("\n### Targets\n");
console.log(
  markdownTable(
    ["target", "measured", "goal", "met"],
    targets.map((t) => [t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  ),
);
const svg = await writeResultFile("routing.svg", await ttftChart(cells, 4));
const path = await writeResult("routing", {
  command,
  timeScale,
  cells,
  twoEdges,
  edge: edgeRuns,
  targets,
});
console.log(`\nwrote ${path} and ${svg}`);
process.exit(0);
