/**
 * `npm run bench:batching` (docs/benchmarks.md, "Micro-batching"): what micro-batching
 * costs at low load and saves at high load. One edge, regions with an origin process each:
 * `batched` through the region's Batcher, `direct` with batching off. The same streaming
 * workload at 1, 32 and 500 closed-loop clients, in alternating rounds: upstream calls per
 * request, batch sizes, time to first byte against the unbatched path, throughput, and the
 * edge's CPU per request. Prints a table and writes bench/results/batching.json; behind
 * `wrangler dev` (`--runtime wrangler-dev`) without its local trace collector.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { markdownTable, benchCommand, resultName, writeResult } from "./lib.ts";
import {
  type Path,
  type Phase,
  type Sample,
  batchingRows,
  batchingTable,
  batchingTargets,
} from "./batching-report.ts";
import { cpuTimeMs, workerdPid } from "./processes.ts";
import {
  DEV_KEY_LIMITS,
  type SpawnedOrigin,
  createKey,
  simFlags,
  spawnOrigin,
} from "../scripts/stack.ts";
import { ROOT, parseRuntime, startEdge, type RunningEdge } from "../scripts/edge.ts";
import { join } from "node:path";
import { randomBytes } from "node:crypto";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "4" },
    "seconds-1": { type: "string", default: "12" },
    "seconds-32": { type: "string", default: "12" },
    "seconds-500": { type: "string", default: "40" },
    "max-tokens": { type: "string", default: "16" },
    "max-window-ms": { type: "string", default: "100" },
    "call-interval-ms": { type: "string", default: "5" },
    "wait-share": { type: "string", default: "0.1" },
    "max-batch-size": { type: "string", default: "64" },
    "max-num-seqs": { type: "string", default: "256" },
    "time-scale": { type: "string", default: "0" },
    runtime: { type: "string", default: "workerd" },
    name: { type: "string", default: "" },
    help: { type: "boolean", short: "h", default: false },
  },
  strict: true,
});
if (args.help) {
  console.log(`usage: npm run bench:batching -- [options]

  --rounds N              alternating rounds per client count (default 4)
  --seconds-1 S           seconds at 1 client, over all rounds and paths (default 12)
  --seconds-32 S          seconds at 32 clients (default 12)
  --seconds-500 S         seconds at 500 clients (default 40)
  --max-tokens N          completion tokens per request (default 16)
  --max-window-ms MS      batching.max_window_ms (default 100)
  --call-interval-ms MS   batching.call_interval_ms (default 5)
  --wait-share X          batching.wait_share (default 0.1, as the edge)
  --max-batch-size N      batching.max_batch_size (default 64)
  --max-num-seqs N        the simulated engine's max_num_seqs (default 256)
  --time-scale X          the simulated engine's time scale (default 0: no delay)
  --runtime R             workerd (default: no dev proxy, as deployed) or wrangler-dev
  --name N                write bench/results/batching-N.json (a scenario kept apart)`);
  process.exit(0);
}
const ROUNDS = Number(args.rounds);
const RUNTIME = parseRuntime(args.runtime);
const SECONDS: Record<number, number> = {
  1: Number(args["seconds-1"]),
  32: Number(args["seconds-32"]),
  500: Number(args["seconds-500"]),
};
const LEVELS = [1, 32, 500] as const;
const MAX_TOKENS = Number(args["max-tokens"]);
const BATCHING = {
  max_window_ms: Number(args["max-window-ms"]),
  call_interval_ms: Number(args["call-interval-ms"]),
  wait_share: Number(args["wait-share"]),
  max_batch_size: Number(args["max-batch-size"]),
  overrides: [
    { region: "direct", enabled: false },
    // The batched path without the idle bypass: every request asks the batcher.
    { region: "asked", idle_bypass_ms: 0 },
  ],
};
const SIM = { timeScale: Number(args["time-scale"]), maxNumSeqs: Number(args["max-num-seqs"]) };
const MODEL = "warmgate-sim-8b";
/** Over how long 100 or more clients start (not measured). */
const RAMP_MS = 1000;
const ALL_CONTINENTS = ["EU", "AF", "NA", "SA", "AS", "OC", "AN"];

const PATHS: Path[] = ["direct", "batched"];
/** Paths per concurrency: at one client also the batcher without its idle bypass. */
const pathsAt = (concurrency: number): Path[] =>
  concurrency === 1 ? ["direct", "batched", "asked"] : PATHS;

/** Origin counters the run reads before and after each phase. */
interface OriginCounts {
  batches: number;
  items: number;
  inFlight: number;
}

async function originCounts(origin: SpawnedOrigin): Promise<OriginCounts> {
  const text = await (await fetch(`${origin.url}/metrics`)).text();
  const read = (name: string) => {
    const line = text.split("\n").find((l) => l.startsWith(`${name} `));
    return line === undefined ? 0 : Number(line.slice(name.length + 1));
  };
  return {
    batches: read("warmgate_origin_batches_total"),
    items: read("warmgate_origin_batch_items_total"),
    inFlight: read("warmgate_origin_items_in_flight"),
  };
}

// --- the stack: two origin processes and one edge -------------------------------------

const origins: Record<Path, SpawnedOrigin> = {
  batched: await spawnOrigin([...simFlags(SIM), "--origin-id", "batched-1", "--region", "batched"]),
  direct: await spawnOrigin([...simFlags(SIM), "--origin-id", "direct-1", "--region", "direct"]),
  asked: await spawnOrigin([...simFlags(SIM), "--origin-id", "asked-1", "--region", "asked"]),
};
const adminToken = `wgadmin_${randomBytes(18).toString("base64url")}`;
const config = {
  models: [{ id: MODEL, max_model_len: 32768 }],
  regions: [
    {
      id: "batched",
      continents: ALL_CONTINENTS,
      origins: [{ id: "batched-1", url: origins.batched.url }],
    },
    { id: "direct", origins: [{ id: "direct-1", url: origins.direct.url }] },
    { id: "asked", origins: [{ id: "asked-1", url: origins.asked.url }] },
  ],
  default_region: "batched",
  // No failover: a request measured on one path is always served by that path's origin.
  limits: { retry_budget: 0 },
  batching: BATCHING,
};
let edge: RunningEdge;
try {
  edge = await startEdge(RUNTIME, {
    config: join(ROOT, "wrangler.toml"),
    vars: {
      WARMGATE_CONFIG: JSON.stringify(config),
      ADMIN_TOKEN: adminToken,
      TOKEN_SIGNING_SECRET: randomBytes(32).toString("base64url"),
    },
  });
} catch (error) {
  await Promise.all(Object.values(origins).map((o) => o.close()));
  throw error;
}
const stopAll = () => Promise.all([edge.stop(), ...Object.values(origins).map((o) => o.close())]);

// --- the workload -------------------------------------------------------------------------

const payload = JSON.stringify({
  model: MODEL,
  messages: [
    { role: "system", content: "You are a concise assistant." },
    { role: "user", content: "Say hello to the batching benchmark." },
  ],
  max_tokens: MAX_TOKENS,
  seed: 7,
  stream: true,
});

async function oneRequest(path: Path, headers: Record<string, string>): Promise<Sample> {
  const started = performance.now();
  const res = await fetch(`${edge.url}/v1/chat/completions`, {
    method: "POST",
    headers: { ...headers, "x-warmgate-region": path },
    body: payload,
  });
  let ttft = Number.NaN;
  let text = "";
  const reader = res.body?.getReader();
  const decoder = new TextDecoder();
  if (reader !== undefined) {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (Number.isNaN(ttft)) ttft = performance.now() - started;
      text += decoder.decode(value, { stream: true });
    }
  }
  const total = performance.now() - started;
  if (res.status !== 200 || !text.endsWith("data: [DONE]\n\n")) {
    throw new Error(`status ${res.status}: ${text.slice(0, 200)}`);
  }
  return { ttft, total };
}

async function batcherSnapshot(path: Path) {
  const res = await fetch(`${edge.url}/admin/batchers/${path}/${MODEL}`, {
    headers: { authorization: `Bearer ${adminToken}` },
  });
  const body = (await res.json()) as {
    shards: { windowMs: number; queued: number; inFlight: Record<string, number> }[];
  };
  const shard = body.shards[0];
  if (shard === undefined) return null;
  const inFlight = Object.values(shard.inFlight).reduce((a, b) => a + b, 0);
  return { windowMs: shard.windowMs, queued: shard.queued, inFlight };
}

async function batcherSizes(path: Path): Promise<Record<string, number>> {
  const res = await fetch(`${edge.url}/admin/batchers/${path}/${MODEL}`, {
    headers: { authorization: `Bearer ${adminToken}` },
  });
  const body = (await res.json()) as {
    shards: { counters: { batchSizes: Record<string, number> } }[];
  };
  const sizes: Record<string, number> = {};
  for (const shard of body.shards) {
    for (const [bucket, n] of Object.entries(shard.counters.batchSizes)) {
      sizes[bucket] = (sizes[bucket] ?? 0) + n;
    }
  }
  return sizes;
}

/** Waits until the origin runs nothing, so a phase does not inherit the last one's tail. */
async function drained(origin: SpawnedOrigin): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await originCounts(origin)).inFlight === 0) return;
    await sleep(25);
  }
}

async function runPhase(
  path: Path,
  concurrency: number,
  seconds: number,
  headers: Record<string, string>,
): Promise<Phase> {
  const origin = origins[path];
  await drained(origin);
  const before = await originCounts(origin);
  const sizesBefore = path === "direct" ? {} : await batcherSizes(path);
  const samples: Sample[] = [];
  let errors = 0;
  let ended = 0;
  let firstError: string | null = null;
  const workerd = await workerdPid(edge.child.pid);
  const cpuBefore = await cpuTimeMs(workerd);
  const started = performance.now();
  const deadline = started + seconds * 1000;
  // Many clients start over a ramp rather than in the same millisecond, and only requests
  // that start after it are measured: the steady state, not the harness's own burst.
  const rampMs = concurrency >= 100 ? RAMP_MS : 0;
  const client = async (index: number) => {
    await sleep((index * rampMs) / concurrency);
    while (performance.now() < deadline) {
      const at = performance.now();
      try {
        const sample = await oneRequest(path, headers);
        if (at - started >= rampMs) samples.push(sample);
      } catch (error) {
        errors += 1;
        firstError ??= error instanceof Error ? error.message : String(error);
      }
      ended += 1;
    }
  };
  const midway =
    path === "direct"
      ? Promise.resolve(null)
      : sleep((seconds * 1000) / 2).then(() => batcherSnapshot(path));
  await Promise.all(Array.from({ length: concurrency }, (_, index) => client(index)));
  const elapsed = (performance.now() - started - rampMs) / 1000;
  await drained(origin);
  const cpuAfter = await cpuTimeMs(workerd);
  const after = await originCounts(origin);
  const batchSizes: Record<string, number> = {};
  if (path !== "direct") {
    for (const [bucket, n] of Object.entries(await batcherSizes(path))) {
      const delta = n - (sizesBefore[bucket] ?? 0);
      if (delta > 0) batchSizes[bucket] = delta;
    }
  }
  return {
    path,
    concurrency,
    seconds: elapsed,
    samples,
    errors,
    firstError,
    calls: after.batches - before.batches,
    items: after.items - before.items,
    batchSizes,
    midway: await midway,
    ended,
    edgeCpuMs: cpuBefore === null || cpuAfter === null ? null : cpuAfter - cpuBefore,
  };
}

const phases: Phase[] = [];
try {
  const apiKey = await createKey(edge.url, adminToken, {
    name: "batching benchmark",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  const headers = { "content-type": "application/json", authorization: `Bearer ${apiKey}` };
  // Warm both paths (JIT, connection pools, the key's account, the prefix cache).
  for (const path of PATHS) await runPhase(path, 8, 2, headers);
  for (const concurrency of LEVELS) {
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate the order each round so drift on a shared machine hits both alike.
      const order = round % 2 === 0 ? pathsAt(concurrency) : pathsAt(concurrency).toReversed();
      for (const path of order) {
        const seconds = (SECONDS[concurrency] ?? 5) / ROUNDS;
        const phase = await runPhase(path, concurrency, seconds, headers);
        phases.push(phase);
        const mid = phase.midway;
        const view =
          mid === null
            ? ""
            : `; midway window ${mid.windowMs.toFixed(1)} ms, ${mid.queued} queued, ${mid.inFlight} in flight`;
        process.stderr.write(
          `c=${concurrency} ${path}: ${phase.samples.length} ok, ${phase.errors} errors, ${phase.calls} calls${view}\n`,
        );
      }
    }
  }
} finally {
  await stopAll();
}

const rows = batchingRows(phases, LEVELS, pathsAt);
const table = batchingTable(rows);
const targets = batchingTargets(rows, BATCHING.max_window_ms);

const command = benchCommand("bench:batching");
console.log(`\n## Micro-batching (\`${command}\`)\n`);
console.log(
  `Streaming chat, ${MAX_TOKENS} tokens, simulated engine (time scale ${SIM.timeScale}, ` +
    `max_num_seqs ${SIM.maxNumSeqs}), one origin process per path, closed loop, ` +
    `${ROUNDS} alternating rounds; 500 clients start over ${RAMP_MS} ms, measured after. ` +
    `Batching: max_window_ms ${BATCHING.max_window_ms}, call_interval_ms ` +
    `${BATCHING.call_interval_ms}, wait_share ${BATCHING.wait_share}, max_batch_size ` +
    `${BATCHING.max_batch_size}. Paths: direct = batching off; batched = through the ` +
    `batcher (with its idle bypass); asked = through the batcher on every request. ` +
    `Edge CPU: the workerd that runs the Worker and its Durable Objects, per request; ` +
    `runtime ${RUNTIME}` +
    (RUNTIME === "wrangler-dev" ? `, wrangler dev's local trace collector off.\n` : ".\n"),
);
console.log(table);
console.log(
  `\n${markdownTable(
    ["target", "measured", "met"],
    targets.map((t) => [t.target, t.value, t.met ? "yes" : "no"]),
  )}`,
);
for (const row of rows) {
  if (row.firstError !== null) console.log(`\n${row.path} c=${row.concurrency}: ${row.firstError}`);
}
const path = await writeResult(
  resultName(args.name ? `batching-${args.name}` : "batching", RUNTIME),
  {
    command,
    runtime: RUNTIME,
    settings: {
      batching: BATCHING,
      sim: SIM,
      maxTokens: MAX_TOKENS,
      localObservability: false,
      rounds: ROUNDS,
      seconds: SECONDS,
    },
    rows,
    targets,
  },
);
console.log(`\nwrote ${path}`);
