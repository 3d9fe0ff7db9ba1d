/**
 * `npm run bench:scale` (docs/benchmarks.md, "Scale out"): 256 and 512 concurrent streams
 * through the edge under workerd against real origin processes, each set against the same
 * origins read directly in the same run; the Batchers split as they lag and merge back in a
 * calm phase that follows. Reports cut streams, breaker openings, tokens/s over the origin's,
 * the shard count over time, and what one shard (fixed) carries below the split lag. Prints
 * tables, writes bench/results/scale.json with a `targets` list.
 */
import { readFile } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { ROOT, parseRuntime, startEdge, type RunningEdge } from "../scripts/edge.ts";
import {
  DEV_KEY_LIMITS,
  type SpawnedOrigin,
  createKey,
  simFlags,
  spawnOrigin,
} from "../scripts/stack.ts";
import { openingsOf, readBreakers, watchBreakers } from "./burst-breakers.ts";
import { benchCommand, resultName, stopOnSignal, targetsTable, writeResult } from "./lib.ts";
import { cpuTimeMs, workerdPid } from "./processes.ts";
import {
  type ScalePhase,
  type ShardPoll,
  capacityTable,
  scaleRows,
  scaleTable,
  scaleTargets,
  shardChanges,
} from "./scale-report.ts";
import { type StreamSample, readStream } from "./streams-client.ts";

const { values: args } = parseArgs({
  options: {
    streams: { type: "string", default: "256,512" },
    "origin-s": { type: "string", default: "15" },
    "edge-s": { type: "string", default: "25" },
    capacity: { type: "string", default: "8,16,32,64,128,256" },
    "capacity-s": { type: "string", default: "5" },
    "calm-s": { type: "string", default: "70" },
    "calm-streams": { type: "string", default: "8" },
    "max-tokens": { type: "string", default: "64" },
    "max-shards": { type: "string", default: "8" },
    "split-lag-ms": { type: "string", default: "20" },
    runtime: { type: "string", default: "workerd" },
  },
  strict: true,
});
const list = (raw: string) => raw.split(",").filter(Boolean).map(Number);
const LEVELS = list(args.streams);
const CAPACITY = list(args.capacity);
const MAX_TOKENS = Number(args["max-tokens"]);
const SPLIT_LAG_MS = Number(args["split-lag-ms"]);
const RUNTIME = parseRuntime(args.runtime);
// Two origins per path, each running up to 256 sequences: 512 streams fill both.
const SIM = { timeScale: 1, maxNumSeqs: 256 };
const MODEL = "warmgate-sim-8b";
const log = (line: string) => process.stderr.write(`${line}\n`);

// --- the stack: two origins read directly, two behind the edge -------------------------------

const direct = await Promise.all(
  [1, 2].map((n) => spawnOrigin([...simFlags(SIM), "--origin-id", `origin-${n}`])),
);
const behind = await Promise.all(
  [1, 2].map((n) => spawnOrigin([...simFlags(SIM), "--origin-id", `edge-${n}`])),
);
const origins: SpawnedOrigin[] = [...direct, ...behind];
const adminToken = `wgadmin_${randomBytes(18).toString("base64url")}`;
const config = {
  models: [{ id: MODEL, max_model_len: 32768 }],
  regions: [
    // Scales out as it lags; `one` is the same origins behind one fixed shard.
    {
      id: "scale",
      continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"],
      origins: behind.map((o, i) => ({ id: `edge-${i + 1}`, url: o.url })),
    },
    { id: "one", origins: behind.map((o, i) => ({ id: `one-${i + 1}`, url: o.url })) },
  ],
  default_region: "scale",
  // No failover: every stream is served by its path's origins, and a failure shows.
  limits: { retry_budget: 0 },
  batching: {
    idle_bypass_ms: 0,
    max_shards: Number(args["max-shards"]),
    split_lag_ms: SPLIT_LAG_MS,
    overrides: [{ region: "one", max_shards: 1 }],
  },
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
  await Promise.all(origins.map((o) => o.close()));
  throw error;
}
const stopAll = () => Promise.all([edge.stop(), ...origins.map((o) => o.close())]).then(() => {});
const unregister = stopOnSignal(stopAll);

// --- the workload: one conversation per client, so each keeps its prefix and its shard ------

function payload(client: number): string {
  const context = `Conversation ${client}: ${"background the assistant keeps in mind. ".repeat(8)}`;
  return JSON.stringify({
    model: MODEL,
    messages: [
      { role: "system", content: context },
      { role: "user", content: "Stream a long answer to the benchmark." },
    ],
    max_tokens: MAX_TOKENS,
    stream: true,
  });
}

/** Seconds the machine's CPUs were busy and in all, from /proc/stat. */
async function machineCpu(): Promise<{ busy: number; total: number }> {
  const line = (await readFile("/proc/stat", "utf8")).split("\n")[0] ?? "";
  const ticks = line.trim().split(/\s+/).slice(1).map(Number);
  const total = ticks.reduce((a, b) => a + b, 0);
  const idle = (ticks[3] ?? 0) + (ticks[4] ?? 0);
  return { busy: total - idle, total };
}

async function shardPoll(region: string, t0: number): Promise<ShardPoll | null> {
  try {
    const res = await fetch(`${edge.url}/admin/batchers/${region}/${MODEL}`, {
      headers: { authorization: `Bearer ${adminToken}` },
      signal: AbortSignal.timeout(5_000),
    });
    const body = (await res.json()) as {
      scaling: { count: number } | null;
      shards: { threadLagMs: number; queued: number; inFlight: Record<string, number> }[];
    };
    return {
      t: (Date.now() - t0) / 1000,
      count: body.scaling?.count ?? body.shards.length,
      lagsMs: body.shards.map((s) => s.threadLagMs),
      inFlight: body.shards.map(
        (s) => s.queued + Object.values(s.inFlight).reduce((a, b) => a + b, 0),
      ),
    };
  } catch {
    return null;
  }
}

const RUN_STARTED = Date.now();

/** `streams` clients, each streaming its own conversation again and again for `seconds`. */
async function runPhase(
  kind: ScalePhase["kind"],
  path: ScalePhase["path"],
  streams: number,
  seconds: number,
  apiKey: string,
  region = "scale",
): Promise<ScalePhase> {
  const target = (client: number): { url: string; headers: Record<string, string> } =>
    path === "origin"
      ? {
          url: `${direct[client % 2]?.url}/v1/chat/completions`,
          headers: { "content-type": "application/json" },
        }
      : {
          url: `${edge.url}/v1/chat/completions`,
          headers: {
            "content-type": "application/json",
            authorization: `Bearer ${apiKey}`,
            "x-warmgate-region": region,
          },
        };
  const workerd = await workerdPid(edge.child.pid);
  const [cpuBefore, machineBefore] = [await cpuTimeMs(workerd), await machineCpu()];
  const breakersBefore = path === "edge" ? await readBreakers(edge.url, adminToken) : null;
  const watcher = path === "edge" ? watchBreakers(edge.url, adminToken, 500) : null;
  if (breakersBefore !== null) watcher?.seed(breakersBefore);
  const polls: ShardPoll[] = [];
  const polling = { on: path === "edge" };
  const poller = (async () => {
    while (polling.on) {
      const poll = await shardPoll(region, RUN_STARTED);
      if (poll !== null) polls.push(poll);
      await sleep(500);
    }
  })();
  const samples: StreamSample[] = [];
  let cut = 0;
  let refused = 0;
  let firstError: string | null = null;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  const client = async (n: number) => {
    const { url, headers } = target(n);
    const body = payload(n);
    while (performance.now() < deadline) {
      try {
        samples.push(await readStream(url, headers, body));
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        firstError ??= message;
        const status = /^status (\d+)/.exec(message)?.[1];
        if (status !== undefined && status !== "200") refused += 1;
        else cut += 1;
      }
    }
  };
  await Promise.all(Array.from({ length: streams }, (_, n) => client(n)));
  const elapsed = (performance.now() - started) / 1000;
  polling.on = false;
  await poller;
  const [cpuAfter, machineAfter] = [await cpuTimeMs(workerd), await machineCpu()];
  const watched = await watcher?.stop();
  const breakersAfter = path === "edge" ? await readBreakers(edge.url, adminToken) : null;
  const openings =
    watched === undefined
      ? 0
      : openingsOf(breakersBefore, breakersAfter, watched.transitions).total;
  return {
    kind,
    path,
    streams,
    seconds: elapsed,
    samples,
    cut,
    refused,
    firstError,
    polls,
    breakerOpenings: openings,
    machineBusy:
      (machineAfter.busy - machineBefore.busy) /
      Math.max(1, machineAfter.total - machineBefore.total),
    edgeCores:
      cpuBefore === null || cpuAfter === null ? null : (cpuAfter - cpuBefore) / 1000 / elapsed,
  };
}

const phases: ScalePhase[] = [];
const record = (phase: ScalePhase) => {
  phases.push(phase);
  const tokens = phase.samples.reduce((sum, s) => sum + s.tokens, 0);
  const shards = phase.polls.at(-1)?.count;
  log(
    `${phase.kind} ${phase.path} ${phase.streams}: ${phase.samples.length} done, ` +
      `${phase.cut} cut, ${phase.refused} refused, ${Math.round(tokens / phase.seconds)} tokens/s` +
      (shards === undefined ? "" : `, ${shards} shards`),
  );
};
try {
  const apiKey = await createKey(edge.url, adminToken, {
    name: "scale benchmark",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  // Warm both paths (JIT, connection pools, the key's account, the prefix caches).
  await runPhase("capacity", "origin", 16, 2, apiKey);
  await runPhase("capacity", "edge", 16, 2, apiKey, "one");
  for (const streams of CAPACITY) {
    record(await runPhase("capacity", "edge", streams, Number(args["capacity-s"]), apiKey, "one"));
  }
  for (const [i, streams] of LEVELS.entries()) {
    // Alternate the order so that drift on a shared machine hits both paths alike.
    const order = i % 2 === 0 ? (["origin", "edge"] as const) : (["edge", "origin"] as const);
    for (const path of order) {
      const seconds = Number(path === "origin" ? args["origin-s"] : args["edge-s"]);
      record(await runPhase("scale", path, streams, seconds, apiKey));
    }
  }
  record(
    await runPhase("calm", "edge", Number(args["calm-streams"]), Number(args["calm-s"]), apiKey),
  );
} finally {
  await stopAll();
  unregister();
}

const rows = scaleRows(phases);
const changes = shardChanges(phases.filter((p) => p.kind !== "capacity").flatMap((p) => p.polls));
const targets = scaleTargets(rows, LEVELS, SPLIT_LAG_MS, changes);
const command = benchCommand("bench:scale");
console.log(`\n## Scale out (\`${command}\`)\n`);
console.log(
  `Streaming chat, ${MAX_TOKENS} tokens, simulated engine at realistic speed, two origin ` +
    `processes per path (${SIM.maxNumSeqs} sequences each), exactly N clients streaming at once, ` +
    `each its own conversation (so its prefix and its shard stay put). Edge under ${RUNTIME}; ` +
    `max_shards ${args["max-shards"]}, split_lag_ms ${SPLIT_LAG_MS}. Every process shares ` +
    `this machine's CPUs: the ratios are against the origins read directly in the same run.\n`,
);
console.log(scaleTable(rows));
console.log(`\n### One shard (max_shards 1) at < ${SPLIT_LAG_MS} ms lag\n`);
console.log(capacityTable(rows, SPLIT_LAG_MS));
console.log(
  `\nShard count over the scale and calm phases (s: count): ${changes.map((c) => `${c.t.toFixed(0)}: ${c.count}`).join(", ")}`,
);
console.log(`\n${targetsTable(targets)}`);
for (const row of rows) {
  if (row.firstError !== null)
    console.log(`\n${row.kind} ${row.path} ${row.streams}: ${row.firstError}`);
}
const path = await writeResult(resultName("scale", RUNTIME), {
  command,
  runtime: RUNTIME,
  settings: { sim: SIM, maxTokens: MAX_TOKENS, levels: LEVELS, capacity: CAPACITY, args },
  rows,
  shardCounts: changes,
  targets,
});
console.log(`\nwrote ${path}`);
