/**
 * `npm run bench:streams` (docs/benchmarks.md, "Streams under load"): whether tokens reach a
 * client one by one, as the engine makes them, at 1, 8 and 64 concurrent streams. Four
 * paths, each with its own origin process and engine at realistic speed: `origin` read
 * directly, `passthrough` (a bare pass-through Worker, the floor for any edge), `edge`
 * (batching off) and `batcher` (every request through the Batcher). Exactly N clients
 * stream at once, in alternating rounds: tokens per client read, gaps between reads, first
 * token, tokens/s against the origin's, and each Worker's CPU per stream against the
 * pass-through's. Prints a table and writes bench/results/streams.json.
 */
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { benchCommand, resultName, stopOnSignal, targetsTable, writeResult } from "./lib.ts";
import { cpuTimeMs, workerdPid } from "./processes.ts";
import { type StreamSample, readStream } from "./streams-client.ts";
import {
  type StreamPath,
  type StreamPhase,
  streamRows,
  streamTargets,
  streamsTable,
} from "./streams-report.ts";
import {
  DEV_KEY_LIMITS,
  type SpawnedOrigin,
  createKey,
  simFlags,
  spawnOrigin,
} from "../scripts/stack.ts";
import { ROOT, parseRuntime, startEdge, type RunningEdge } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "3" },
    seconds: { type: "string", default: "4" },
    "max-tokens": { type: "string", default: "64" },
    "time-scale": { type: "string", default: "1" },
    runtime: { type: "string", default: "workerd" },
    batching: { type: "string", default: "{}" },
    streams: { type: "string", default: "1,8,64" },
    name: { type: "string", default: "" },
    help: { type: "boolean", short: "h", default: false },
  },
  strict: true,
});
if (args.help) {
  console.log(`usage: npm run bench:streams -- [options]

  --rounds N        alternating rounds per stream count (default 3)
  --seconds S       seconds each path streams per round (default 4)
  --max-tokens N    completion tokens per stream (default 64)
  --time-scale X    the simulated engine's time scale (default 1: realistic speed)
  --runtime R       workerd (default: as deployed) or wrangler-dev
  --streams LIST    concurrent stream counts (default 1,8,64)
  --batching JSON   batching settings of the batcher path (default {}: as it ships)
  --name N          write bench/results/streams-N.json (a scenario kept apart)`);
  process.exit(0);
}
const ROUNDS = Number(args.rounds);
const SECONDS = Number(args.seconds);
const MAX_TOKENS = Number(args["max-tokens"]);
const RUNTIME = parseRuntime(args.runtime);
/** Settings of the batcher path beyond its defaults (a trade-off measured against them). */
const BATCHER_SETTINGS = JSON.parse(args.batching) as Record<string, unknown>;
const SIM = { timeScale: Number(args["time-scale"]), maxNumSeqs: 256 };
const LEVELS = args.streams.split(",").map(Number);
const PATHS: StreamPath[] = ["origin", "passthrough", "edge", "batcher"];
const MODEL = "warmgate-sim-8b";
const ALL_CONTINENTS = ["EU", "AF", "NA", "SA", "AS", "OC", "AN"];

// --- the stack: one origin process per path, one edge ------------------------------------

const origins = {} as Record<StreamPath, SpawnedOrigin>;
for (const path of PATHS) {
  origins[path] = await spawnOrigin([...simFlags(SIM), "--origin-id", `${path}-1`]);
}
const adminToken = `wgadmin_${randomBytes(18).toString("base64url")}`;
const config = {
  models: [{ id: MODEL, max_model_len: 32768 }],
  regions: [
    {
      id: "batcher",
      continents: ALL_CONTINENTS,
      origins: [{ id: "batcher-1", url: origins.batcher.url }],
    },
    { id: "edge", origins: [{ id: "edge-1", url: origins.edge.url }] },
  ],
  default_region: "batcher",
  // No failover: a stream measured on one path is always served by that path's origin.
  limits: { retry_budget: 0 },
  // The Batcher as it ships, asked on every request (no idle bypass), and the edge alone.
  batching: {
    overrides: [
      { ...BATCHER_SETTINGS, region: "batcher", idle_bypass_ms: 0 },
      { region: "edge", enabled: false },
    ],
  },
};
let edge: RunningEdge;
let passthrough: RunningEdge;
try {
  edge = await startEdge(RUNTIME, {
    config: join(ROOT, "wrangler.toml"),
    vars: {
      WARMGATE_CONFIG: JSON.stringify(config),
      ADMIN_TOKEN: adminToken,
      TOKEN_SIGNING_SECRET: randomBytes(32).toString("base64url"),
    },
  });
  passthrough = await startEdge(RUNTIME, {
    config: join(ROOT, "bench", "passthrough", "wrangler.toml"),
    vars: { ORIGIN_URL: origins.passthrough.url },
  }).catch(async (error: unknown) => {
    await edge.stop();
    throw error;
  });
} catch (error) {
  await Promise.all(Object.values(origins).map((o) => o.close()));
  throw error;
}
const stopAll = () =>
  Promise.all([
    edge.stop(),
    passthrough.stop(),
    ...Object.values(origins).map((o) => o.close()),
  ]).then(() => {});
const unregister = stopOnSignal(stopAll);

// --- the workload ----------------------------------------------------------------------------

const payload = JSON.stringify({
  model: MODEL,
  messages: [
    { role: "system", content: "You are a concise assistant." },
    { role: "user", content: "Stream a long answer to the benchmark." },
  ],
  max_tokens: MAX_TOKENS,
  seed: 7,
  stream: true,
});

function target(
  path: StreamPath,
  apiKey: string,
): { url: string; headers: Record<string, string> } {
  const json = { "content-type": "application/json" };
  if (path === "origin") return { url: `${origins.origin.url}/v1/chat/completions`, headers: json };
  if (path === "passthrough")
    return { url: `${passthrough.url}/v1/chat/completions`, headers: json };
  return {
    url: `${edge.url}/v1/chat/completions`,
    headers: { ...json, authorization: `Bearer ${apiKey}`, "x-warmgate-region": path },
  };
}

/** Items the origin runs now. */
async function originInFlight(origin: SpawnedOrigin): Promise<number> {
  const text = await (await fetch(`${origin.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("warmgate_origin_items_in_flight "));
  return line === undefined ? 0 : Number(line.split(" ")[1]);
}

/** Waits until the origin runs nothing, so a phase does not inherit the last one's tail. */
async function drained(origin: SpawnedOrigin): Promise<void> {
  for (let i = 0; i < 200 && (await originInFlight(origin)) > 0; i++) await sleep(25);
}

async function batcherHolds(): Promise<number> {
  const res = await fetch(`${edge.url}/admin/batchers/batcher/${MODEL}`, {
    headers: { authorization: `Bearer ${adminToken}` },
  });
  const body = (await res.json()) as { shards: { counters: { holds: number } }[] };
  return body.shards.reduce((sum, shard) => sum + shard.counters.holds, 0);
}

/** `streams` clients streaming one after another for `seconds`; the phase ends with the last. */
async function runPhase(
  path: StreamPath,
  streams: number,
  seconds: number,
  apiKey: string,
): Promise<StreamPhase> {
  await drained(origins[path]);
  const { url, headers } = target(path, apiKey);
  const workerd =
    path === "origin"
      ? null
      : await workerdPid((path === "passthrough" ? passthrough : edge).child.pid);
  const cpuBefore = await cpuTimeMs(workerd);
  const holdsBefore = path === "batcher" ? await batcherHolds() : null;
  const samples: StreamSample[] = [];
  let errors = 0;
  let firstError: string | null = null;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  const client = async () => {
    while (performance.now() < deadline) {
      try {
        samples.push(await readStream(url, headers, payload));
      } catch (error) {
        errors += 1;
        firstError ??= error instanceof Error ? error.message : String(error);
      }
    }
  };
  await Promise.all(Array.from({ length: streams }, client));
  const elapsed = (performance.now() - started) / 1000;
  const cpuAfter = await cpuTimeMs(workerd);
  const holdsAfter = path === "batcher" ? await batcherHolds() : null;
  return {
    path,
    streams,
    seconds: elapsed,
    samples,
    errors,
    firstError,
    edgeCpuMs: cpuBefore === null || cpuAfter === null ? null : cpuAfter - cpuBefore,
    holds: holdsBefore === null || holdsAfter === null ? null : holdsAfter - holdsBefore,
  };
}

const phases: StreamPhase[] = [];
try {
  const apiKey = await createKey(edge.url, adminToken, {
    name: "streams benchmark",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  // Warm every path (JIT, connection pools, the key's account, the prefix cache).
  for (const path of PATHS) await runPhase(path, 8, 2, apiKey);
  for (const streams of LEVELS) {
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate the order each round so drift on a shared machine hits every path alike.
      for (const path of round % 2 === 0 ? PATHS : PATHS.toReversed()) {
        const phase = await runPhase(path, streams, SECONDS, apiKey);
        phases.push(phase);
        process.stderr.write(
          `streams=${streams} ${path}: ${phase.samples.length} done, ${phase.errors} errors\n`,
        );
      }
    }
  }
} finally {
  await stopAll();
  unregister();
}

const rows = streamRows(phases, LEVELS, PATHS);
const targets = streamTargets(rows);
const command = benchCommand("bench:streams");
console.log(`\n## Streams under load (\`${command}\`)\n`);
console.log(
  `Streaming chat, ${MAX_TOKENS} tokens, simulated engine at time scale ${SIM.timeScale}, ` +
    `one origin process per path, exactly N clients streaming at once, ${ROUNDS} alternating ` +
    `rounds of ${SECONDS} s. Paths: origin = the origin read directly; passthrough = a bare ` +
    `pass-through Worker (the floor for any edge); edge = the edge with ` +
    `batching off; batcher = through the Batcher on every request (no idle bypass; settings ` +
    `${JSON.stringify(BATCHER_SETTINGS)} beyond the defaults). Tokens/read: content tokens per client read that carried any; read gap: between ` +
    `such reads. CPU: the workerd that runs the Worker (and its Durable Objects), per ` +
    `stream, and over the pass-through's at the same stream count; runtime ${RUNTIME}.\n`,
);
console.log(streamsTable(rows));
console.log(`\n${targetsTable(targets)}`);
for (const row of rows) {
  if (row.firstError !== null) console.log(`\n${row.path} ${row.streams}: ${row.firstError}`);
}
const path = await writeResult(
  resultName(args.name ? `streams-${args.name}` : "streams", RUNTIME),
  {
    command,
    runtime: RUNTIME,
    settings: {
      batcher: BATCHER_SETTINGS,
      sim: SIM,
      maxTokens: MAX_TOKENS,
      rounds: ROUNDS,
      seconds: SECONDS,
    },
    rows,
    targets,
  },
);
console.log(`\nwrote ${path}`);
