/**
 * `npm run bench:profile`: where one request's CPU goes at the edge. Starts the stack
 * (edge under workerd with its V8 inspector, one simulated origin without delay), sends
 * requests from `--clients` closed-loop clients (one by default; `--max-tokens`, and
 * `--time-scale 1` for an engine at realistic speed) with a key whose limits, budgets and ledger are on, and records a
 * CPU profile of the Worker's isolate (the edge and its Durable Objects) over them through
 * the inspector (`Profiler.start`/`stop`). Each sample is charged to the source module its
 * function came from (esbuild's `// path` markers in the bundle) and to a stage of the
 * request; prints milliseconds per request by stage and the busiest functions, and writes
 * the `.cpuprofile` (for Chrome DevTools) to the OS temp folder. `--batch-lines N` profiles
 * a Batch API batch of N lines instead, per line. See docs/benchmarks.md.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { benchChatBody } from "./chat-body.ts";
import { closedLoop, fmt, markdownTable, timedRequest } from "./lib.ts";
import { BENCH_KEY_BUDGETS, BENCH_KEY_LIMITS } from "./key-limits.ts";
import { inspectWorker } from "./inspector.ts";
import { cpuTimeMs, workerdPid } from "./processes.ts";
import {
  type CpuProfile,
  GAP_CAP_SPACINGS,
  chargeProfile,
  moduleRanges,
} from "./profile-stages.ts";
import { batchFile } from "./batch-api-report.ts";
import { batchEnded, startBatch } from "./batch-api-checks.ts";
import { DEV_KEY_LIMITS, createKey, startStack } from "../scripts/stack.ts";
import { freePort } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    requests: { type: "string", default: "400" },
    warm: { type: "string", default: "300" },
    "prompt-tokens": { type: "string", default: "0" },
    stream: { type: "boolean", default: false },
    clients: { type: "string", default: "1" },
    interval: { type: "string", default: "50" },
    pause: { type: "string", default: "0" },
    top: { type: "string", default: "25" },
    "batch-lines": { type: "string", default: "0" },
    "max-tokens": { type: "string", default: "16" },
    "time-scale": { type: "string", default: "0" },
  },
  strict: true,
});
const REQUESTS = Number(args.requests);
const PROMPT_TOKENS = Number(args["prompt-tokens"]);
const CLIENTS = Number(args.clients);
// Each client's pause after each answer: bench:overhead's one-client phase sends each path a
// request every few to 30 ms (it alternates four paths), and what runs by time (a settlement
// sent in a call of its own, the ledger's commit) then falls to each request. Read the /proc
// figure then: the sampler charges the pauses to whatever the thread last held.
const PAUSE_MS = Number(args.pause);
/** With lines: one batch of that many lines (two origins, the lane 128 lines wide). */
const BATCH_LINES = Number(args["batch-lines"]);

const body = () => benchChatBody(Number(args["max-tokens"]), args.stream, PROMPT_TOKENS);

const inspectorPort = await freePort();
const stack = await startStack({
  regions: [
    {
      id: "local",
      continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"],
      origins: BATCH_LINES > 0 ? 2 : 1,
    },
  ],
  // 1: the engine at realistic speed, each token its own read (0: none waits).
  sim: { timeScale: Number(args["time-scale"]) },
  originProcesses: true,
  runtime: "workerd",
  inspectorPort,
  ...(BATCH_LINES > 0 && { settings: { batch_api: { lines_in_flight: 128 } } }),
});
let report: string;
try {
  const apiKey = await createKey(stack.edgeUrl, stack.adminToken, {
    name: "bench-profile",
    // A batch's key may name the region its batch runs in; requests carry budgets.
    ...(BATCH_LINES > 0
      ? { limits: DEV_KEY_LIMITS, allow_region_override: true }
      : { limits: BENCH_KEY_LIMITS, budgets: BENCH_KEY_BUDGETS }),
  });
  const url = `${stack.edgeUrl}/v1/chat/completions`;
  const headers = { "content-type": "application/json", authorization: `Bearer ${apiKey}` };
  const payload = body();
  const send = async () => {
    const { total } = await timedRequest(url, headers, payload);
    if (PAUSE_MS > 0) await sleep(PAUSE_MS);
    return total;
  };
  const runBatch = async (lines: number) => {
    const { jsonl } = batchFile(lines, 32);
    const batch = await startBatch(stack.edgeUrl, apiKey, jsonl, "local");
    const ended = await batchEnded(stack.edgeUrl, apiKey, batch.id, () => {}, 200);
    if (ended.status !== "completed") throw new Error(`batch ${ended.status}`);
  };
  const UNITS = BATCH_LINES > 0 ? BATCH_LINES : REQUESTS;
  const unit = BATCH_LINES > 0 ? "line" : "request";
  if (BATCH_LINES > 0) await runBatch(200);
  else await closedLoop(CLIENTS, Number(args.warm), send);

  const inspector = await inspectWorker(inspectorPort);
  await inspector.send("Profiler.enable");
  await inspector.send("Profiler.setSamplingInterval", { interval: Number(args.interval) });
  const workerd = await workerdPid(stack.edge.pid);
  const cpuBefore = await cpuTimeMs(workerd);
  const started = performance.now();
  await inspector.send("Profiler.start");
  if (BATCH_LINES > 0) await runBatch(BATCH_LINES);
  else await closedLoop(CLIENTS, REQUESTS, send);
  // The ledger's settlement runs after the response.
  await sleep(100);
  const { profile } = await inspector.send<{ profile: CpuProfile }>("Profiler.stop");
  const wallMs = performance.now() - started;
  const cpuMs = ((await cpuTimeMs(workerd)) ?? NaN) - (cpuBefore ?? NaN);
  // The bundle's text, for the module markers (read after profiling: the debugger costs).
  await inspector.send("Debugger.enable");
  const scripts = new Map<string, string>();
  for (const node of profile.nodes) {
    const id = node.callFrame.scriptId;
    if (id === "0" || scripts.has(id)) continue;
    const { scriptSource } = await inspector
      .send<{ scriptSource: string }>("Debugger.getScriptSource", { scriptId: id })
      .catch(() => ({ scriptSource: "" }));
    scripts.set(id, scriptSource);
  }
  inspector.close();
  const ranges = new Map([...scripts].map(([id, source]) => [id, moduleRanges(source)]));
  const charged = chargeProfile(profile, ranges);
  const file = join(tmpdir(), `warmgate-edge-${Date.now()}.cpuprofile`);
  await writeFile(file, JSON.stringify(profile));
  const per = (ms: number) => fmt(ms / UNITS, 3);
  const what =
    BATCH_LINES > 0
      ? `${BATCH_LINES} lines of one Batch API batch of 32-token lines, two origins without delay`
      : `${REQUESTS} requests from ${CLIENTS} client${CLIENTS === 1 ? "" : "s"} (${args.stream ? "stream" : "JSON"}, ${PROMPT_TOKENS === 0 ? "short prompt" : `${PROMPT_TOKENS}-token prompt`})`;
  report = [
    `${what}: wall ${fmt(wallMs / UNITS)} ms/${unit}, workerd CPU ${fmt(cpuMs / UNITS)} ms/${unit} (/proc), sampled in JS isolate ${per(charged.busyMs)} ms/${unit}; gaps between samples beyond ${fmt(charged.capMs, 2)} ms (${GAP_CAP_SPACINGS}× the median spacing: the thread parked or out of the sampler's sight) ${per(charged.gapMs)} ms/${unit}, charged to no stage.`,
    "",
    markdownTable(
      ["stage", `ms/${unit}`, "share"],
      charged.stages.map(([stage, ms]) => [
        stage,
        per(ms),
        `${fmt((100 * ms) / charged.busyMs, 1)}%`,
      ]),
    ),
    "",
    markdownTable(
      ["function", "module", `self ms/${unit}`],
      charged.functions
        .slice(0, Number(args.top))
        .map(([name, module, ms]) => [name, module, per(ms)]),
    ),
    "",
    `profile: ${file}`,
  ].join("\n");
} finally {
  await stack.stop();
}
console.log(report);
