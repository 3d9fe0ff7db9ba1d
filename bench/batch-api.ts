/**
 * `npm run bench:batch-api` (docs/benchmarks.md, "Batch API"): interactive streams at about
 * 60% of the fleet's slots, alone, then while a batch of 10,000 lines runs on the same
 * origins (midway the whole edge is killed and started again), then alone again. Targets:
 * interactive TTFT p99 within 10% of the runs alone, origins kept busy while the batch has work (their
 * own load figures), every line answered and billed once, in `custom_id` order, none lost
 * or run twice across the restart. Prints a table, writes bench/results/batch-api.json and
 * a chart of origin utilisation over time, bench/results/batch-api.svg.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { auditBatch, batchEnded, originBackground, startBatch } from "./batch-api-checks.ts";
import {
  type BatchApiRun,
  batchApiTargets,
  batchFile,
  interactiveClient,
  sampleOrigins,
  windowRows,
} from "./batch-api-report.ts";
import { utilisationChart } from "./batch-api-chart.ts";
import { benchCommand, markdownTable, stopOnSignal, writeResult, writeResultFile } from "./lib.ts";
import { readOriginItems } from "./chaos-lookup.ts";
import { workerdPid } from "./processes.ts";
import { DEV_KEY_LIMITS, createKey, startStack } from "../scripts/stack.ts";

const { values: args } = parseArgs({
  options: {
    lines: { type: "string" },
    quick: { type: "boolean", default: false },
    "no-restart": { type: "boolean", default: false },
    seconds: { type: "string" },
    origins: { type: "string", default: "2" },
    slots: { type: "string", default: "32" },
    share: { type: "string", default: "0.6" },
    "max-tokens": { type: "string", default: "64" },
    "line-tokens": { type: "string", default: "32" },
    "time-scale": { type: "string", default: "1" },
    "background-reserve": { type: "string", default: "0.1" },
    name: { type: "string", default: "" },
    "lines-in-flight": { type: "string" },
    help: { type: "boolean", short: "h", default: false },
  },
  strict: true,
});
if (args.help) {
  console.log(`usage: npm run bench:batch-api -- [options]

  --lines N         lines of the batch (default 10000; --quick 1000)
  --quick           a short run: 1,000 lines, 10 s alone
  --no-restart      leave the edge running (the restart's targets then prove nothing)
  --seconds S       seconds of interactive load alone (default 30; --quick 10)
  --origins N       simulated origins in the region (default 2)
  --slots N         each engine's running slots, --max-num-seqs (default 32)
  --share X         interactive streams as a share of every slot (default 0.6)
  --max-tokens N    tokens per interactive stream (default 64)
  --line-tokens N   tokens per batch line (default 32)
  --time-scale X    the simulated engine's time scale (default 1: realistic speed)
  --background-reserve X  the origins' --background-reserve: share of slots batch lines
                    leave to interactive requests (default 0.1)
  --lines-in-flight N  batch_api.lines_in_flight (default: twice the slots)
  --name N          write bench/results/batch-api-N.json and .svg (a scenario kept apart)`);
  process.exit(0);
}
const LINES = Number(args.lines ?? (args.quick ? 1_000 : 10_000));
const ALONE_S = Number(args.seconds ?? (args.quick ? 10 : 30));
const ORIGINS = Number(args.origins);
const SLOTS = Number(args.slots);
const SHARE = Number(args.share);
const STREAMS = Math.round(SHARE * ORIGINS * SLOTS);
const MAX_TOKENS = Number(args["max-tokens"]);
const LINE_TOKENS = Number(args["line-tokens"]);
const TIME_SCALE = Number(args["time-scale"]);
/** Share of each engine's slots its origin keeps from batch lines for interactive requests. */
const BACKGROUND_RESERVE = Number(args["background-reserve"]);
/** The batch lane's own cap: enough lines in flight to fill every free slot. */
const LINES_IN_FLIGHT = Number(args["lines-in-flight"] ?? 2 * ORIGINS * SLOTS);
const REGION = "eu";
/** The edge is killed once this share of the batch's lines ended. */
const KILL_AT = 0.5;
/** After the edge is back, interactive samples this long are not compared (cold isolate). */
const SETTLE_MS = 5_000;

const state = await mkdtemp(join(tmpdir(), "warmgate-batch-api-"));
const stack = await startStack({
  regions: [
    { id: REGION, continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: ORIGINS },
  ],
  sim: { timeScale: TIME_SCALE, maxNumSeqs: SLOTS },
  backgroundReserve: BACKGROUND_RESERVE,
  originProcesses: true,
  runtime: "workerd",
  persistTo: state,
  // An interactive request is tried once: the origins' ok items are then the lines' and theirs.
  limits: { retry_budget: 0 },
  settings: {
    batch_api: { lines_in_flight: LINES_IN_FLIGHT },
  },
});
const stopAll = async () => {
  await stack.stop();
  await rm(state, { recursive: true, force: true });
};
const unregister = stopOnSignal(stopAll);
const origins = stack.origins.map(({ origin }) => ({
  id: origin.originId,
  url: origin.url,
  token: stack.originAccessToken,
}));

const t0 = performance.now();
const at = () => (performance.now() - t0) / 1000;
const log = (line: string) => process.stderr.write(`[${at().toFixed(1)} s] ${line}\n`);

let result: BatchApiRun & { batchSeconds: number };
let background = { okRuns: 0, replayed: 0, preemptions: 0, rerunTokens: 0 };
try {
  const interactiveKey = await createKey(stack.edgeUrl, stack.adminToken, {
    name: "interactive",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  const batchKey = await createKey(stack.edgeUrl, stack.adminToken, {
    name: "batch",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  const { jsonl, customIds } = batchFile(LINES, LINE_TOKENS);
  const client = interactiveClient(() => stack.edgeUrl, interactiveKey, REGION, MAX_TOKENS);
  const sampler = sampleOrigins(origins, at, () => workerdPid(stack.edge.pid));

  // Warm the edge, the key's account and the origins' prefix caches; then interactive alone.
  log(`warming up: ${STREAMS} streams`);
  await client.run(STREAMS, 3_000, at);
  const aloneFrom = at();
  log(`interactive alone for ${ALONE_S} s`);
  const alone = await client.run(STREAMS, ALONE_S * 1000, at);
  const aloneTo = at();

  // The batch, with the same interactive load until it ends; the edge killed midway.
  const before = await originBackground(origins);
  const stop = new AbortController();
  const phases: Record<string, number> = { aloneFrom, aloneTo };
  const load = client.run(STREAMS, Number.POSITIVE_INFINITY, at, stop.signal);
  await sleep(1_000);
  const batch = await startBatch(stack.edgeUrl, batchKey, jsonl, REGION);
  phases["batchFrom"] = at();
  log(`batch ${batch.id}: ${LINES} lines`);
  let killed = false;
  let lastLog = 0;
  const done = await batchEnded(stack.edgeUrl, batchKey, batch.id, async (view) => {
    const ended = view.request_counts.completed + view.request_counts.failed;
    if (at() - lastLog > 10) {
      lastLog = at();
      log(`batch ${view.status}: ${ended}/${LINES} ended`);
    }
    if (!killed && !args["no-restart"] && ended >= LINES * KILL_AT) {
      killed = true;
      phases["killedAt"] = at();
      log(`killing the edge's process group at ${ended} lines ended`);
      await stack.restartEdge({ crash: true });
      phases["backAt"] = at();
      log(`edge back after ${(phases["backAt"] - (phases["killedAt"] ?? 0)).toFixed(1)} s`);
    }
  });
  phases["batchTo"] = at();
  stop.abort();
  const withBatch = await load;
  log(`batch ${done.status} in ${(phases["batchTo"] - (phases["batchFrom"] ?? 0)).toFixed(1)} s`);
  // Alone again, so that the run alone brackets the batch and the host's drift over the run
  // moves both sides alike.
  phases["againFrom"] = at();
  log(`interactive alone again for ${ALONE_S} s`);
  const again = await client.run(STREAMS, ALONE_S * 1000, at);
  phases["againTo"] = at();
  await sampler.stop();

  await sleep(2_000);
  const audit = await auditBatch({
    edgeUrl: stack.edgeUrl,
    key: batchKey,
    adminToken: stack.adminToken,
    batch: done,
    customIds,
    origins,
  });
  // The origins' own TTFT of each interactive stream: what of the client's the edge adds.
  const streams = [...alone.samples, ...withBatch.samples, ...again.samples];
  const items = await readOriginItems(
    origins,
    streams.flatMap((s) => s.requestId ?? []),
  );
  for (const sample of streams) {
    for (const item of items?.get(sample.requestId ?? "") ?? []) {
      if (item.state === "ended" && item.timing?.ttft_ms != null) {
        sample.originTtftMs = item.timing.ttft_ms;
        sample.origin = item.origin;
        sample.originQueuedMs = item.timing.queued_ms;
      }
    }
  }
  // The origins' background lanes: lines run to the end (the batch key runs nothing else
  // there), answered again from a kept answer, stopped for interactive requests.
  const after = await originBackground(origins);
  background = {
    okRuns: after.okRuns - before.okRuns,
    replayed: after.replayed - before.replayed,
    preemptions: after.preemptions - before.preemptions,
    rerunTokens: after.rerunTokens - before.rerunTokens,
  };
  result = {
    alone: {
      samples: [...alone.samples, ...again.samples],
      errors: [...alone.errors, ...again.errors],
    },
    withBatch,
    load: sampler.samples,
    cpu: sampler.cpu,
    audit,
    phases,
    background,
    batchSeconds: phases["batchTo"] - (phases["batchFrom"] ?? 0),
  };
} finally {
  await stopAll();
  unregister();
}

const { phases } = result;
const windows = windowRows(result, {
  slots: SLOTS,
  reserveShare: BACKGROUND_RESERVE,
  excludeFrom: (phases["killedAt"] ?? 0) - 2,
  excludeTo: (phases["backAt"] ?? 0) + SETTLE_MS / 1000,
});
const targets = batchApiTargets(result, windows);
const command = benchCommand("bench:batch-api");
console.log(`\n## Batch API (\`${command}\`)\n`);
console.log(
  `${ORIGINS} simulated origins of ${SLOTS} slots at time scale ${TIME_SCALE}; ${STREAMS} ` +
    `interactive streams (${SHARE * 100}% of the slots) of ${MAX_TOKENS} tokens, alone for ` +
    `${ALONE_S} s, then with a batch of ${LINES} lines of ${LINE_TOKENS} tokens (16 shared ` +
    `prefixes), then alone for ${ALONE_S} s again (the run alone is both)` +
    (args["no-restart"]
      ? ""
      : `; the edge's process group killed at ${KILL_AT * 100}% of the lines and started again`) +
    `. Origins busy: running sequences over all slots, and over the slots the batch lane may ` +
    `fill (all but the ${BACKGROUND_RESERVE * 100}% the origins reserve), from the origins' own metrics ` +
    `every 250 ms. Batch took ${result.batchSeconds.toFixed(1)} s.\n`,
);
console.log(
  markdownTable(
    [
      "phase",
      "streams done",
      "errors",
      "TTFT p50 ms",
      "TTFT p99 ms",
      "origin's TTFT p99 ms",
      "edge CPU (one core)",
      "origin slots busy",
      "batch-fillable slots busy",
    ],
    args["no-restart"] ? windows.rows.slice(0, 2) : windows.rows,
  ),
);
console.log();
console.log(
  markdownTable(
    ["target", "measured", "goal", "met"],
    targets.map((t) => [t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  ),
);
const RESULT = args.name ? `batch-api-${args.name}` : "batch-api";
const svg = await writeResultFile(
  `${RESULT}.svg`,
  await utilisationChart(result.load, phases, SLOTS),
);
const path = await writeResult(RESULT, {
  command,
  settings: {
    lines: LINES,
    aloneSeconds: ALONE_S,
    origins: ORIGINS,
    slots: SLOTS,
    streams: STREAMS,
    share: SHARE,
    maxTokens: MAX_TOKENS,
    lineTokens: LINE_TOKENS,
    timeScale: TIME_SCALE,
    linesInFlight: LINES_IN_FLIGHT,
    backgroundReserve: BACKGROUND_RESERVE,
  },
  phases,
  batchSeconds: result.batchSeconds,
  windows: windows.summary,
  slowest: [...result.alone.samples, ...result.withBatch.samples]
    .toSorted((a, b) => b.ttftMs - a.ttftMs)
    .slice(0, 40),
  audit: result.audit,
  background,
  targets,
});
console.log(
  `\nOrigins answered ${background.replayed} lines sent again from their kept answers, and ` +
    `stopped ${background.preemptions} running lines for interactive requests, which had ` +
    `generated ${background.rerunTokens} completion tokens.`,
);
console.log(`\nwrote ${path} and ${svg}`);
