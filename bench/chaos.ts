/**
 * `npm run bench:chaos`: the edge tried as an attacker's faults and a careless client
 * would (see docs/benchmarks.md, "Chaos"). At least 2,000 mixed requests at concurrency 50
 * while every origin answers 20% errors, hangs and cuts streams; one origin killed and
 * started again; then the whole edge killed and started again. Prints a table and writes
 * bench/results/chaos.json with the counts and a `losses` map, each target 0.
 */
import { parseArgs } from "node:util";
import { runChaos } from "./chaos-core.ts";
import {
  benchCommand,
  markdownTable,
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
  },
  strict: true,
});

const report = await runChaos({
  requests: Number(args.requests),
  concurrency: Number(args.concurrency),
  seed: Number(args.seed),
  timeScale: Number(args["time-scale"]),
  settleWaitMs: Number(args["settle-wait-ms"]),
  log: (line) => console.error(line),
});

const targets: Record<string, TargetResult> = {};
for (const [name, value] of Object.entries(report.losses)) {
  targets[name] = { value, target: "0", met: value === 0 };
}
console.log(
  markdownTable(
    [
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
      [
        report.counts.sent,
        report.counts.complete,
        report.counts.billedExactly,
        `${report.counts.clientAborts} (${report.counts.abortsAfterTheEnd} after the end)`,
        report.counts.connectionsFailed,
        report.counts.originFailures,
        report.counts.rateLimited,
        report.counts.streamsEndedWithErrorEvent,
      ].map(String),
    ],
  ),
);
console.log();
console.log(targetsTable(targets));
const path = await writeResult("chaos", {
  command: benchCommand("bench:chaos"),
  at: new Date().toISOString(),
  ...report,
  targets,
});
console.error(`wrote ${path}`);
