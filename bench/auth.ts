/**
 * `npm run bench:auth` (docs/benchmarks.md, "Cost of keys and limits"): what per-key
 * accounts cost. One workload, alternating three ways against one simulated origin:
 * `previous` (a static key, bench/auth-baseline `static`), `no-account` (the keyed path
 * with the admission made up in the isolate, `local`) and `keyed` (the edge, a KeyAccount
 * call per completion). All batch through a Batcher. Prints a table and writes
 * bench/results/auth.json; the goal: the account's call adds at most 1 ms p50.
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { benchChatBody } from "./chat-body.ts";
import {
  compareAlternating,
  PATH_COLUMNS,
  pathCells,
  benchCommand,
  resultName,
  fmt,
  markdownTable,
  targetsTable,
  timedRequest,
  writeResult,
  type PathResult,
  type Workload,
} from "./lib.ts";
import { BENCH_KEY_BUDGETS, BENCH_KEY_LIMITS } from "./key-limits.ts";
import { createKey, startStack } from "../scripts/stack.ts";
import { ROOT, parseRuntime, startEdge, type RunningEdge } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "6" },
    "c1-requests": { type: "string", default: "600" },
    "c16-requests": { type: "string", default: "2400" },
    "max-tokens": { type: "string", default: "16" },
    "block-warm": { type: "string", default: "24" },
    runtime: { type: "string", default: "workerd" },
  },
  strict: true,
});
const RUNTIME = parseRuntime(args.runtime);
const ROUNDS = Number(args.rounds);
const C1_REQUESTS = Number(args["c1-requests"]);
const C16_REQUESTS = Number(args["c16-requests"]);
const MAX_TOKENS = Number(args["max-tokens"]);

type Target = "previous" | "no-account" | "keyed";
const TARGETS: Target[] = ["previous", "no-account", "keyed"];

const body = (stream: boolean) => benchChatBody(MAX_TOKENS, stream);

const stack = await startStack({
  regions: [{ id: "local", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 1 }],
  sim: { timeScale: 0 },
  originProcesses: true,
  runtime: RUNTIME,
});
const staticKey = `bench-${crypto.randomUUID()}`;
const baselines: RunningEdge[] = [];
try {
  for (const mode of ["static", "local"]) {
    baselines.push(
      await startEdge(RUNTIME, {
        config: join(ROOT, "bench", "auth-baseline", "wrangler.toml"),
        // The edge's signing secret, so the bench key passes the `local` path's key check.
        vars: {
          WARMGATE_CONFIG: stack.config,
          BENCH_API_KEY: staticKey,
          BENCH_MODE: mode,
          TOKEN_SIGNING_SECRET: stack.signingSecret,
          // The origins demand their token from every edge.
          ORIGIN_TOKEN: stack.originAccessToken,
        },
      }),
    );
  }
} catch (error) {
  await Promise.all(baselines.map((baseline) => baseline.stop()));
  await stack.stop();
  throw error;
}
const [previous, noAccount] = baselines;
if (previous === undefined || noAccount === undefined) throw new Error("baselines not started");
const benchKey = await createKey(stack.edgeUrl, stack.adminToken, {
  name: "bench:auth",
  limits: BENCH_KEY_LIMITS,
  budgets: BENCH_KEY_BUDGETS,
});

const endpoints: Record<Target, { url: string; key: string }> = {
  previous: { url: `${previous.url}/v1/chat/completions`, key: staticKey },
  "no-account": { url: `${noAccount.url}/v1/chat/completions`, key: benchKey },
  keyed: { url: `${stack.edgeUrl}/v1/chat/completions`, key: benchKey },
};

type Scenario = "json c=1" | "stream c=1" | "json c=16" | "stream c=16";
const SCENARIOS: Workload<Scenario>[] = [
  { name: "json c=1", stream: false, concurrency: 1, requests: C1_REQUESTS },
  { name: "stream c=1", stream: true, concurrency: 1, requests: C1_REQUESTS },
  { name: "json c=16", stream: false, concurrency: 16, requests: C16_REQUESTS },
  { name: "stream c=16", stream: true, concurrency: 16, requests: C16_REQUESTS },
];

let rows: PathResult<Scenario, Target>[];
try {
  // Warm-up also reaches the key's Durable Object and the prefix cache.
  rows = await compareAlternating({
    workloads: SCENARIOS,
    targets: TARGETS,
    rounds: ROUNDS,
    warmRequests: 200,
    blockWarmRequests: Number(args["block-warm"]),
    send: (target, stream) => {
      const { url, key } = endpoints[target];
      return timedRequest(
        url,
        { "content-type": "application/json", authorization: `Bearer ${key}` },
        body(stream),
      );
    },
  });
} finally {
  await Promise.all(baselines.map((baseline) => baseline.stop()));
  await stack.stop();
}
const find = (s: Scenario, t: Target) => rows.find((r) => r.scenario === s && r.target === t);

const table = markdownTable(
  [...PATH_COLUMNS, "+p50 vs previous", "+p50 vs no-account", "errors"],
  rows.map((r) => {
    const before = find(r.scenario, "previous");
    const local = find(r.scenario, "no-account");
    return [
      ...pathCells(r),
      r.target === "previous" ? "" : fmt(r.total.p50 - (before?.total.p50 ?? Number.NaN)),
      r.target === "keyed" ? fmt(r.total.p50 - (local?.total.p50 ?? Number.NaN)) : "",
      String(r.errors),
    ];
  }),
);

const added = (s: Scenario, field: "total" | "ttfb", base: Target) =>
  (find(s, "keyed")?.[field].p50 ?? Number.NaN) - (find(s, base)?.[field].p50 ?? Number.NaN);
const doJson = added("json c=1", "total", "no-account");
const doTtfb = added("stream c=1", "ttfb", "no-account");
const allJson = added("json c=1", "total", "previous");
const allTtfb = added("stream c=1", "ttfb", "previous");
const targets = {
  do_call_added_p50_ms_json_c1: { value: doJson, target: "<= 1", met: doJson <= 1 },
  do_call_added_ttfb_p50_ms_stream_c1: { value: doTtfb, target: "<= 1", met: doTtfb <= 1 },
  accounts_added_p50_ms_json_c1: { value: allJson, target: "(reported)", met: true },
  accounts_added_ttfb_p50_ms_stream_c1: { value: allTtfb, target: "(reported)", met: true },
};

console.log(`Runtime: ${RUNTIME} (all three Workers).\n`);
console.log(table);
console.log("");
console.log(targetsTable(targets));
const command = benchCommand("bench:auth");
const path = await writeResult(resultName("auth", RUNTIME), {
  command,
  runtime: RUNTIME,
  date: new Date().toISOString(),
  settings: {
    rounds: ROUNDS,
    c1Requests: C1_REQUESTS,
    c16Requests: C16_REQUESTS,
    maxTokens: MAX_TOKENS,
    blockWarmRequests: Number(args["block-warm"]),
    keyLimits: BENCH_KEY_LIMITS,
  },
  rows,
  targets,
});
console.log(`wrote ${path}`);
