/**
 * `npm run bench:overhead`: what the edge costs. The same workloads, alternating, four ways
 * on loopback: straight to a simulated origin (no simulated delay), through a bare
 * pass-through Worker under the same runtime as the edge (the floor for any edge), through
 * the Portkey AI Gateway on this Node (an anchor, `bench/portkey.ts`) and through the
 * warmgate edge with keys, limits, budgets and the ledger on. JSON and streams at 1 and 32
 * clients, then JSON at one client with prompts of 1k, 8k and 31.5k tokens; for each, the
 * CPU time per request of each path's serving process. `--keys N` adds the edge again with
 * its requests spread over N keys in turn. `--quick` runs it smaller. Prints
 * tables and writes bench/results/overhead.json (overhead-wrangler-dev.json behind
 * `wrangler dev`). See docs/benchmarks.md.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { join } from "node:path";
import { benchChatBody } from "./chat-body.ts";
import {
  benchCommand,
  compareAlternating,
  resultName,
  fmt,
  timedRequest,
  writeResult,
  type Workload,
} from "./lib.ts";
import { BENCH_KEY_BUDGETS, BENCH_KEY_LIMITS } from "./key-limits.ts";
import { cpuTimeMs, workerdPid, workerdRss } from "./processes.ts";
import { type RunningPortkey, PORTKEY_VERSION, startPortkey } from "./portkey.ts";
import {
  type OverheadRow,
  type Scenario,
  type Target,
  overheadTable,
  manyKeysRatios,
  overheadTargets,
  promptSizeTable,
} from "./overhead-report.ts";
import { targetsTable } from "./lib.ts";
import { createKey, startStack } from "../scripts/stack.ts";
import { ROOT, parseRuntime, startEdge } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    rounds: { type: "string" },
    "c1-requests": { type: "string" },
    "c32-requests": { type: "string" },
    "prompt-requests": { type: "string" },
    "max-tokens": { type: "string", default: "16" },
    "block-warm": { type: "string", default: "24" },
    "no-portkey": { type: "boolean", default: false },
    // Workloads whose name contains this (`c=32`, `k`, …): for exploring, not for results.
    only: { type: "string" },
    runtime: { type: "string", default: "workerd" },
    keys: { type: "string", default: "1" },
  },
  strict: true,
});
const quick = args.quick;
const RUNTIME = parseRuntime(args.runtime);
const ROUNDS = Number(args.rounds ?? (quick ? 2 : 4));
const C1_REQUESTS = Number(args["c1-requests"] ?? (quick ? 200 : 600));
const C32_REQUESTS = Number(args["c32-requests"] ?? (quick ? 480 : 1200));
const PROMPT_REQUESTS = Number(args["prompt-requests"] ?? (quick ? 80 : 240));
const MAX_TOKENS = Number(args["max-tokens"]);
const BLOCK_WARM = Number(args["block-warm"]);
const KEYS = Math.max(1, Math.floor(Number(args.keys)));

/** Prompt sizes (tokens) of the prompt workloads; the largest fits the 32,768-token window. */
const PROMPT_SIZES = { "1k": 1_000, "8k": 8_000, "32k": 31_500 } as const;

interface Phase extends Workload<Scenario> {
  promptTokens: number | null;
}
const ALL_PHASES: Phase[] = [
  { name: "json c=1", stream: false, concurrency: 1, requests: C1_REQUESTS, promptTokens: null },
  { name: "json c=32", stream: false, concurrency: 32, requests: C32_REQUESTS, promptTokens: null },
  { name: "stream c=1", stream: true, concurrency: 1, requests: C1_REQUESTS, promptTokens: null },
  {
    name: "stream c=32",
    stream: true,
    concurrency: 32,
    requests: C32_REQUESTS,
    promptTokens: null,
  },
  ...Object.entries(PROMPT_SIZES).map(([size, tokens]) => ({
    name: `json c=1 ${size}` as Scenario,
    stream: false,
    concurrency: 1,
    requests: PROMPT_REQUESTS,
    promptTokens: tokens,
  })),
];

const PHASES = ALL_PHASES.filter((p) => args.only === undefined || p.name.includes(args.only));

const bodies = new Map<string, string>();
const bodyOf = (phase: Phase, stream: boolean) => {
  const key = `${phase.promptTokens}:${stream}`;
  let body = bodies.get(key);
  if (body === undefined) {
    body = benchChatBody(MAX_TOKENS, stream, phase.promptTokens ?? 0);
    bodies.set(key, body);
  }
  return body;
};

const stack = await startStack({
  regions: [{ id: "local", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 1 }],
  sim: { timeScale: 0 },
  originProcesses: true,
  runtime: RUNTIME,
});
const origin = stack.origins[0]?.origin;
if (!origin) throw new Error("no origin started");
const passthrough = await startEdge(RUNTIME, {
  config: join(ROOT, "bench", "passthrough", "wrangler.toml"),
  vars: { ORIGIN_URL: origin.url },
});
let portkey: RunningPortkey | null = null;
let portkeyMissing: string | null = args["no-portkey"] ? "left out (--no-portkey)" : null;
if (portkeyMissing === null) {
  try {
    portkey = await startPortkey();
  } catch (error) {
    portkeyMissing = `could not be installed or started: ${(error as Error).message.split("\n")[0]}`;
  }
}
if (portkeyMissing !== null) {
  console.log(`Portkey ${portkeyMissing}; scoring against the pass-through only.`);
}
const apiKey = await createKey(stack.edgeUrl, stack.adminToken, {
  name: "bench-overhead",
  limits: BENCH_KEY_LIMITS,
  budgets: BENCH_KEY_BUDGETS,
});

// The many keys' path: each request the next key's, in turn.
const manyKeys: string[] = [];
for (let i = 0; i < (KEYS > 1 ? KEYS : 0); i++) {
  manyKeys.push(
    await createKey(stack.edgeUrl, stack.adminToken, {
      name: `bench-overhead-${i}`,
      limits: BENCH_KEY_LIMITS,
    }),
  );
}
let nextKey = 0;

const TARGETS: Target[] = [
  "direct",
  "passthrough",
  ...(portkey ? ["portkey" as const] : []),
  "warmgate",
  ...(KEYS > 1 ? ["warmgate-keys" as const] : []),
];
const urls: Record<Target, string> = {
  direct: `${origin.url}/v1/chat/completions`,
  passthrough: `${passthrough.url}/v1/chat/completions`,
  portkey: `${portkey?.url}/v1/chat/completions`,
  warmgate: `${stack.edgeUrl}/v1/chat/completions`,
  "warmgate-keys": `${stack.edgeUrl}/v1/chat/completions`,
};
// The origin, and the pass-through and Portkey in front of it, take the origin's access
// token; the edge takes an API key.
const headers: Record<Target, Record<string, string>> = {
  direct: { authorization: `Bearer ${stack.originAccessToken}` },
  passthrough: { authorization: `Bearer ${stack.originAccessToken}` },
  portkey: {
    authorization: `Bearer ${stack.originAccessToken}`,
    "x-portkey-provider": "openai",
    "x-portkey-custom-host": `${origin.url}/v1`,
  },
  warmgate: { authorization: `Bearer ${apiKey}` },
  "warmgate-keys": {},
};
for (const h of Object.values(headers)) h["content-type"] = "application/json";
const headersOf = (target: Target): Record<string, string> =>
  target === "warmgate-keys"
    ? { ...headers.warmgate, authorization: `Bearer ${manyKeys[nextKey++ % manyKeys.length]}` }
    : headers[target];

// The process that serves each path (the origin serves every path: no figure of its own).
const servingPid: Record<Target, number | null> = {
  direct: null,
  passthrough: await workerdPid(passthrough.child.pid),
  portkey: portkey?.child.pid ?? null,
  warmgate: await workerdPid(stack.edge.pid),
  "warmgate-keys": null,
};
servingPid["warmgate-keys"] = KEYS > 1 ? servingPid.warmgate : null;

// Both edge paths run in one process: its CPU time is charged to the path that sent last
// (what a response leaves behind, its settlement, is that path's too).
const EDGE_PATHS: readonly Target[] = ["warmgate", "warmgate-keys"];
const edgeCpu = new Map<Target, number>();
let edgePath: Target | null = null;
let edgeMark = 0;
async function chargeEdge(next: Target | null): Promise<void> {
  if (KEYS === 1 || (next !== null && (!EDGE_PATHS.includes(next) || next === edgePath))) return;
  const previous = edgePath;
  edgePath = next;
  const now = (await cpuTimeMs(servingPid.warmgate)) ?? Number.NaN;
  if (previous !== null) edgeCpu.set(previous, (edgeCpu.get(previous) ?? 0) + now - edgeMark);
  edgeMark = now;
}
const cpuNow = async () =>
  Object.fromEntries(
    await Promise.all(TARGETS.map(async (t) => [t, await cpuTimeMs(servingPid[t])] as const)),
  ) as Record<Target, number | null>;

const edgeMemory: { phase: string; rss: number | null }[] = [];
const rows: OverheadRow[] = [];
try {
  edgeMemory.push({ phase: "idle", rss: await workerdRss(stack.edge.pid ?? 0) });
  // Every path warmed on every body before anything is measured.
  for (const phase of PHASES.filter((p) => p.concurrency === 1)) {
    await compareAlternating({
      workloads: [{ ...phase, requests: 16 }],
      targets: TARGETS,
      rounds: 1,
      warmRequests: 32,
      blockWarmRequests: 0,
      send: (target, stream) =>
        timedRequest(urls[target], headersOf(target), bodyOf(phase, stream)),
    });
  }
  for (const phase of PHASES) {
    const sent = new Map<Target, number>();
    const before = await cpuNow();
    edgeCpu.clear();
    edgePath = null;
    const measured = await compareAlternating({
      workloads: [phase],
      targets: TARGETS,
      rounds: ROUNDS,
      warmRequests: 0,
      blockWarmRequests: BLOCK_WARM,
      send: async (target, stream) => {
        sent.set(target, (sent.get(target) ?? 0) + 1);
        await chargeEdge(target);
        return timedRequest(urls[target], headersOf(target), bodyOf(phase, stream));
      },
    });
    // Work a response left behind (the ledger's settlement) is the request's too.
    await sleep(250);
    const after = await cpuNow();
    await chargeEdge(null);
    for (const row of measured) {
      const shared = KEYS > 1 && EDGE_PATHS.includes(row.target);
      const used = shared
        ? (edgeCpu.get(row.target) ?? Number.NaN)
        : (after[row.target] ?? Number.NaN) - (before[row.target] ?? Number.NaN);
      rows.push({ ...row, cpuMsPerRequest: used / (sent.get(row.target) ?? Number.NaN) });
    }
    process.stderr.write(`${phase.name} done\n`);
  }
  edgeMemory.push({ phase: "after load", rss: await workerdRss(stack.edge.pid ?? 0) });
} finally {
  await Promise.all([passthrough.stop(), portkey?.stop(), stack.stop()]);
}

const targets = { ...overheadTargets(rows, portkey !== null), ...manyKeysRatios(rows) };
const memoryLine = edgeMemory
  .map((m) => `${m.phase}: ${m.rss === null ? "unknown" : `${fmt(m.rss / 1024 / 1024, 1)} MiB`}`)
  .join(", ");

console.log(
  `Runtime: ${RUNTIME} (both Workers). Portkey ${portkey ? PORTKEY_VERSION : portkeyMissing}.\n`,
);
console.log(overheadTable(rows));
console.log("");
console.log(promptSizeTable(rows));
console.log("");
console.log(targetsTable(targets));
console.log("");
console.log(`edge (workerd) RSS — ${memoryLine}`);
const path = await writeResult(resultName("overhead", RUNTIME), {
  command: benchCommand("bench:overhead"),
  runtime: RUNTIME,
  date: new Date().toISOString(),
  settings: {
    quick,
    rounds: ROUNDS,
    c1Requests: C1_REQUESTS,
    c32Requests: C32_REQUESTS,
    promptRequests: PROMPT_REQUESTS,
    promptTokens: PROMPT_SIZES,
    maxTokens: MAX_TOKENS,
    blockWarmRequests: BLOCK_WARM,
    keys: KEYS,
    portkey: portkey ? PORTKEY_VERSION : portkeyMissing,
  },
  rows,
  targets,
  edgeMemory,
});
console.log(`wrote ${path}`);
