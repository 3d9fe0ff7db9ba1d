/**
 * `npm run bench:chaos`: the edge tried as an attacker's faults and a careless client
 * would (see docs/benchmarks.md, "Chaos"). At least 2,000 mixed requests at concurrency 50
 * while every origin answers 20% errors, hangs and cuts streams; one origin killed and
 * started again; a burst of streams at once; then the whole edge killed and started again.
 * Prints the bills by outcome, the errors by code and the losses, and writes
 * bench/results/chaos.json with a `targets` list, each loss's goal 0.
 */
import { parseArgs } from "node:util";
import type { OutcomeRow } from "./chaos-ledger.ts";
import { runChaos } from "./chaos-core.ts";
import { benchCommand, fmt, markdownTable, provenance, writeResult } from "./lib.ts";

const { values: args } = parseArgs({
  options: {
    requests: { type: "string", default: "2000" },
    concurrency: { type: "string", default: "50" },
    seed: { type: "string", default: "17" },
    "time-scale": { type: "string", default: "1" },
    "early-wait-ms": { type: "string", default: "5000" },
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
  earlyWaitMs: Number(args["early-wait-ms"]),
  settleWaitMs: Number(args["settle-wait-ms"]),
  burst: Number(args.burst),
  log: (line) => console.error(line),
});

/** One loss against its goal of 0. */
interface ChaosTarget {
  target: string;
  value: number;
  measured: string;
  goal: string;
  met: boolean;
}

const targets: ChaosTarget[] = Object.entries(report.losses).map(([target, value]) => ({
  target,
  value,
  measured: String(value),
  goal: "0",
  met: value === 0,
}));

const billRows = (label: string, rows: readonly OutcomeRow[]) =>
  rows.map((r) =>
    [
      label,
      r.outcome,
      r.sent,
      r.byId,
      r.generatedTokens,
      r.exact,
      r.under,
      r.over,
      `${r.unbilled} (${r.unbilledTokens} tokens)`,
      r.double,
      r.unchecked,
    ].map(String),
  );
console.log(
  markdownTable(
    [
      "requests",
      "outcome",
      "sent",
      "matched by id",
      "tokens generated",
      "billed exactly",
      "under",
      "over",
      "unbilled",
      "double",
      "unchecked",
    ],
    [
      ...billRows("all", report.bills),
      ...(report.burstBills === null ? [] : billRows("the burst", report.burstBills)),
    ],
  ),
);
console.log();
const codes = [
  ...new Set([...Object.keys(report.errors.answers), ...Object.keys(report.errors.events)]),
];
console.log(
  markdownTable(
    ["", ...codes],
    [
      ["5xx answers", ...codes.map((c) => String(report.errors.answers[c] ?? 0))],
      ["error events", ...codes.map((c) => String(report.errors.events[c] ?? 0))],
      ...(report.burstErrors === null
        ? []
        : [
            [
              "the burst: 5xx answers",
              ...codes.map((c) => String(report.burstErrors?.answers[c] ?? 0)),
            ],
            [
              "the burst: error events",
              ...codes.map((c) => String(report.burstErrors?.events[c] ?? 0)),
            ],
          ]),
    ],
  ),
);
console.log();
for (const event of report.timeline)
  console.log(`- ${(event.at_ms / 1000).toFixed(1)} s: ${event.event}`);
for (const [code, row] of Object.entries(report.errorsPerSecond))
  console.log(`- ${code} answers per second from the first request: ${row.join(" ")}`);
console.log();
console.log(
  markdownTable(
    ["loss", "measured", "goal", "met"],
    targets.map((t) => [t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  ),
);
console.log();
for (const [name, value] of Object.entries(report.reported))
  console.log(`- ${name}: ${fmt(value, Number.isInteger(value) ? 0 : 1)}`);
const path = await writeResult("chaos", {
  command: benchCommand("bench:chaos"),
  at: new Date().toISOString(),
  provenance: origin,
  ...report,
  targets,
});
console.error(`wrote ${path}`);
