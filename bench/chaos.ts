/**
 * `npm run bench:chaos`: the edge tried as an attacker's faults and a careless client
 * would (see docs/benchmarks.md, "Chaos"). At least 2,000 mixed requests at concurrency 50
 * while every origin answers 20% errors, hangs and cuts streams; one origin killed and
 * started again; a burst of streams at once; then the whole edge killed and started again.
 * Prints a table and writes bench/results/chaos.json with the counts and a `losses` map,
 * each target 0.
 */
import { parseArgs } from "node:util";
import type { ChaosCounts } from "./chaos-client.ts";
import { runChaos } from "./chaos-core.ts";
import {
  benchCommand,
  markdownTable,
  provenance,
  targetsTable,
  writeResult,
  type TargetResult,
} from "./lib.ts";

const { values: args } = parseArgs({
  options: {
    requests: { type: "string", default: "2000" },
    concurrency: { type: "string", default: "50" },
    seed: { type: "string", default: "17" },
    "time-scale": { type: "string", default: "1" },
    "settle-wait-ms": { type: "string", default: "35000" },
    burst: { type: "string", default: "300" },
  },
  strict: true,
});

const origin = provenance();
const report = await runChaos({
  requests: Number(args.requests),
  concurrency: Number(args.concurrency),
  seed: Number(args.seed),
  timeScale: Number(args["time-scale"]),
  settleWaitMs: Number(args["settle-wait-ms"]),
  burst: Number(args.burst),
  log: (line) => console.error(line),
});

const targets: Record<string, TargetResult> = {};
for (const [name, value] of Object.entries(report.losses)) {
  targets[name] = { value, target: "0", met: value === 0 };
}
const row = (label: string, c: ChaosCounts) =>
  [
    label,
    c.sent,
    c.complete,
    c.billedExactly,
    `${c.clientAborts} (${c.abortsAfterTheEnd} after the end)`,
    c.connectionsFailed,
    c.originFailures,
    c.rateLimited,
    c.streamsEndedWithErrorEvent,
  ].map(String);
console.log(
  markdownTable(
    [
      "requests",
      "sent",
      "complete",
      "billed exactly",
      "client aborts",
      "connections failed",
      "origin failures (502/503/504)",
      "429",
      "error events",
    ],
    [
      row("all", report.counts),
      ...(report.burst === null ? [] : [row("of which the burst", report.burst)]),
    ],
  ),
);
console.log();
console.log(targetsTable(targets));
const path = await writeResult("chaos", {
  command: benchCommand("bench:chaos"),
  at: new Date().toISOString(),
  provenance: origin,
  ...report,
  targets,
});
console.error(`wrote ${path}`);
