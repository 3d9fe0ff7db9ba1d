/**
 * `npm run bench:lease` (docs/benchmarks.md, "Leased allowances"): what a far key account
 * costs a request. One workload, alternating three edges against the same simulated
 * origin: `near` (the edge as deployed, its accounts beside it), `far` (every call to a
 * key's account 80 ms away, `WARMGATE_ACCOUNT_DELAY_MS`, leases on) and `far-exact` (the
 * same, leases off: the round trip every request paid before). Prints a table and writes
 * bench/results/lease.json; the goal: a far account adds at most 5 ms p50.
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
import { createKey, startStack } from "../scripts/stack.ts";
import { ROOT, parseRuntime, startEdge, type RunningEdge } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "4" },
    "c1-requests": { type: "string", default: "400" },
    "c16-requests": { type: "string", default: "1600" },
    "max-tokens": { type: "string", default: "16" },
    "delay-ms": { type: "string", default: "80" },
    runtime: { type: "string", default: "workerd" },
  },
  strict: true,
});
const RUNTIME = parseRuntime(args.runtime);
const ROUNDS = Number(args.rounds);
const DELAY_MS = Number(args["delay-ms"]);

type Target = "near" | "far" | "far-exact";
const TARGETS: Target[] = ["near", "far", "far-exact"];

/** Limits a key has headroom under throughout the run. */
const BENCH_KEY_LIMITS = {
  rpm: 100_000_000,
  tpm: 1_000_000_000_000,
  concurrency: 1_024,
  credit_usd: 100_000_000,
};

const stack = await startStack({
  regions: [{ id: "local", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 1 }],
  sim: { timeScale: 0 },
  originProcesses: true,
  runtime: RUNTIME,
});
const far: RunningEdge[] = [];
try {
  for (const leases of [true, false]) {
    const config = { ...(JSON.parse(stack.config) as object), leases: { enabled: leases } };
    far.push(
      await startEdge(RUNTIME, {
        config: join(ROOT, "wrangler.toml"),
        vars: {
          WARMGATE_CONFIG: JSON.stringify(config),
          ADMIN_TOKEN: stack.adminToken,
          TOKEN_SIGNING_SECRET: stack.signingSecret,
          ORIGIN_TOKEN: stack.originAccessToken,
          WARMGATE_ACCOUNT_DELAY_MS: String(DELAY_MS),
        },
      }),
    );
  }
} catch (error) {
  await Promise.all(far.map((edge) => edge.stop()));
  await stack.stop();
  throw error;
}
const [farLeased, farExact] = far;
if (farLeased === undefined || farExact === undefined) throw new Error("edges not started");
const urls: Record<Target, string> = {
  near: stack.edgeUrl,
  far: farLeased.url,
  "far-exact": farExact.url,
};
const keys = {} as Record<Target, string>;
for (const target of TARGETS) {
  keys[target] = await createKey(urls[target], stack.adminToken, {
    name: `bench:lease:${target}`,
    limits: BENCH_KEY_LIMITS,
    budgets: [{ period: "1d", max_usd: 1_000_000 }],
  });
}

type Scenario = "json c=1" | "stream c=1" | "json c=16";
const SCENARIOS: Workload<Scenario>[] = [
  { name: "json c=1", stream: false, concurrency: 1, requests: Number(args["c1-requests"]) },
  { name: "stream c=1", stream: true, concurrency: 1, requests: Number(args["c1-requests"]) },
  { name: "json c=16", stream: false, concurrency: 16, requests: Number(args["c16-requests"]) },
];

let rows: PathResult<Scenario, Target>[];
try {
  rows = await compareAlternating({
    workloads: SCENARIOS,
    targets: TARGETS,
    rounds: ROUNDS,
    warmRequests: 100,
    blockWarmRequests: 16,
    send: (target, stream) =>
      timedRequest(
        `${urls[target]}/v1/chat/completions`,
        { "content-type": "application/json", authorization: `Bearer ${keys[target]}` },
        benchChatBody(Number(args["max-tokens"]), stream),
      ),
  });
} finally {
  await Promise.all(far.map((edge) => edge.stop()));
  await stack.stop();
}
const find = (s: Scenario, t: Target) => rows.find((r) => r.scenario === s && r.target === t);
const added = (s: Scenario, field: "total" | "ttfb", target: Target) =>
  (find(s, target)?.[field].p50 ?? Number.NaN) - (find(s, "near")?.[field].p50 ?? Number.NaN);

const table = markdownTable(
  [...PATH_COLUMNS, "+p50 vs near", "errors"],
  rows.map((r) => [
    ...pathCells(r),
    r.target === "near" ? "" : fmt(added(r.scenario, "total", r.target)),
    String(r.errors),
  ]),
);
const json = added("json c=1", "total", "far");
const ttfb = added("stream c=1", "ttfb", "far");
const targets = {
  far_account_added_p50_ms_json_c1: { value: json, target: "≤ 5 ms", met: json <= 5 },
  far_account_added_ttfb_p50_ms_stream_c1: { value: ttfb, target: "≤ 5 ms", met: ttfb <= 5 },
  far_account_added_p50_ms_json_c16: {
    value: added("json c=16", "total", "far"),
    target: "(reported)",
    met: true,
  },
  far_exact_added_p50_ms_json_c1: {
    value: added("json c=1", "total", "far-exact"),
    target: "(reported: the round trip without leases)",
    met: true,
  },
};

console.log(`Runtime: ${RUNTIME}; ${DELAY_MS} ms before every call to a far key's account.\n`);
console.log(table);
console.log("");
console.log(targetsTable(targets));
const path = await writeResult(resultName("lease", RUNTIME), {
  command: benchCommand("bench:lease"),
  runtime: RUNTIME,
  date: new Date().toISOString(),
  settings: {
    rounds: ROUNDS,
    c1Requests: Number(args["c1-requests"]),
    c16Requests: Number(args["c16-requests"]),
    maxTokens: Number(args["max-tokens"]),
    delayMs: DELAY_MS,
    keyLimits: BENCH_KEY_LIMITS,
  },
  rows,
  targets,
});
console.log(`wrote ${path}`);
