/**
 * `npm run bench:tail` (docs/benchmarks.md, "Where the tail goes"): where a streamed
 * request's time to first byte goes at 500 clients, on the batched and unbatched paths:
 * before the Worker, in the Worker, from its Response to the headers, and from the headers
 * to the first byte. The edge's workerd writes its async activity trace
 * (`scripts/workerd.ts --async-trace --entry-worker`); each request carries its number in
 * its `user-agent`, which joins the client's timestamps to the runtime's. Tracing costs
 * CPU: compare the paths here, take absolute figures from `bench:batching`.
 */
import { createReadStream } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { benchChatBody } from "./chat-body.ts";
import { benchCommand, fmt, markdownTable, writeResult } from "./lib.ts";
import {
  DEV_KEY_LIMITS,
  type SpawnedOrigin,
  createKey,
  simFlags,
  spawnOrigin,
} from "../scripts/stack.ts";
import { ROOT, startWorkerd } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    clients: { type: "string", default: "500" },
    seconds: { type: "string", default: "6" },
    "max-tokens": { type: "string", default: "16" },
    "max-batch-size": { type: "string", default: "64" },
    shards: { type: "string", default: "1" },
    "time-scale": { type: "string", default: "0" },
    "max-num-seqs": { type: "string", default: "256" },
  },
  strict: true,
});
const CLIENTS = Number(args.clients);
const SECONDS = Number(args.seconds);
const MAX_TOKENS = Number(args["max-tokens"]);
const MODEL = "warmgate-sim-8b";
const RAMP_MS = 1000;
const USER_AGENT = "warmgate-bench-tail/";

type Path = "batched" | "direct";
const PATHS: Path[] = ["batched", "direct"];

const SIM = { timeScale: Number(args["time-scale"]), maxNumSeqs: Number(args["max-num-seqs"]) };
const origins: Record<Path, SpawnedOrigin> = {
  batched: await spawnOrigin([...simFlags(SIM), "--origin-id", "batched-1", "--region", "batched"]),
  direct: await spawnOrigin([...simFlags(SIM), "--origin-id", "direct-1", "--region", "direct"]),
};
const config = {
  models: [{ id: MODEL, max_model_len: 32768 }],
  regions: [
    {
      id: "batched",
      continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"],
      origins: [{ id: "batched-1", url: origins.batched.url }],
    },
    { id: "direct", origins: [{ id: "direct-1", url: origins.direct.url }] },
  ],
  default_region: "batched",
  limits: { retry_budget: 0 },
  batching: {
    max_window_ms: 100,
    call_interval_ms: 5,
    wait_share: 0.1,
    max_batch_size: Number(args["max-batch-size"]),
    shards: Number(args.shards),
    overrides: [{ region: "direct", enabled: false }],
  },
};
const scratch = await mkdtemp(join(tmpdir(), "warmgate-tail-"));
const traceFile = join(scratch, "trace.jsonl");
const adminToken = `wgadmin_${randomBytes(18).toString("base64url")}`;
const edge = await startWorkerd({
  config: join(ROOT, "wrangler.toml"),
  vars: {
    WARMGATE_CONFIG: JSON.stringify(config),
    ADMIN_TOKEN: adminToken,
    TOKEN_SIGNING_SECRET: randomBytes(32).toString("base64url"),
  },
  asyncTrace: traceFile,
  // The trace names a request only by the user-agent of the entry Worker's call to the edge.
  entryWorker: true,
});

/** One request as the client saw it; times in ms since the epoch. */
interface ClientSample {
  path: Path;
  seq: number;
  sent: number;
  headers: number;
  firstByte: number;
}

const wallNow = () => performance.timeOrigin + performance.now();
const payload = benchChatBody(MAX_TOKENS, true);

let seq = 0;
async function phase(path: Path, clients: number, seconds: number, key: string) {
  const samples: ClientSample[] = [];
  const started = performance.now();
  const until = started + seconds * 1000;
  await Promise.all(
    Array.from({ length: clients }, async (_, i) => {
      // Clients start spread over the ramp, and only what starts after it is measured.
      if (clients >= 100) await sleep((i * RAMP_MS) / clients);
      while (performance.now() < until) {
        const mine = ++seq;
        const sent = wallNow();
        const measured = performance.now() - started >= RAMP_MS || clients < 100;
        const response = await fetch(`${edge.url}/v1/chat/completions`, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            authorization: `Bearer ${key}`,
            "x-warmgate-region": path,
            "user-agent": `${USER_AGENT}${mine}`,
          },
          body: payload,
        });
        const headers = wallNow();
        const reader = response.body?.getReader();
        let firstByte = Number.NaN;
        for (;;) {
          const chunk = await reader?.read();
          if (chunk === undefined || chunk.done) break;
          if (Number.isNaN(firstByte)) firstByte = wallNow();
        }
        if (response.status !== 200) throw new Error(`${path}: status ${response.status}`);
        if (measured) samples.push({ path, seq: mine, sent, headers, firstByte });
      }
    }),
  );
  return samples;
}

/** The fields of a trace event this benchmark reads (times in ns on the trace's clock). */
interface TraceEvent {
  e: string;
  ctx?: number;
  id?: number;
  at?: number;
  worker?: string;
  kind?: string;
  k?: string;
  v?: unknown;
  epochUnixMs?: number;
}

/** What the trace tells of one request: when its JavaScript started and its Response. */
interface RuntimeTimes {
  start: number;
  response: number;
}

/**
 * Reads the trace: the entry Worker's request contexts, each with its start, the call that
 * forwards it to the edge (annotated with the request's user-agent) and that call's answer.
 */
async function readTrace(file: string): Promise<Map<number, RuntimeTimes>> {
  let epoch = Number.NaN;
  const entryContexts = new Set<number>();
  const starts = new Map<number, number>();
  const seqOf = new Map<string, number>();
  const settled = new Map<string, number>();
  for await (const line of createInterface({ input: createReadStream(file) })) {
    const event = JSON.parse(line) as TraceEvent;
    const { ctx = -1, id = -1, at = Number.NaN } = event;
    switch (event.e) {
      case "header":
        epoch = event.epochUnixMs ?? Number.NaN;
        break;
      case "ctx":
        if (event.worker === "core:entry") entryContexts.add(ctx);
        break;
      case "init":
        if (entryContexts.has(ctx) && event.kind === "request") starts.set(ctx, at);
        break;
      case "annotate": {
        const value = event.v;
        if (
          event.k === "user_agent.original" &&
          typeof value === "string" &&
          value.startsWith(USER_AGENT)
        ) {
          seqOf.set(`${ctx}:${id}`, Number(value.slice(USER_AGENT.length)));
        }
        break;
      }
      case "settle":
        if (entryContexts.has(ctx)) settled.set(`${ctx}:${id}`, at);
        break;
    }
  }
  const times = new Map<number, RuntimeTimes>();
  for (const [call, mine] of seqOf) {
    const start = starts.get(Number(call.split(":")[0]));
    const response = settled.get(call);
    if (start === undefined || response === undefined) continue;
    times.set(mine, { start: epoch + start / 1e6, response: epoch + response / 1e6 });
  }
  return times;
}

const quantile = (sorted: number[], q: number) =>
  sorted.length === 0 ? Number.NaN : (sorted[Math.floor(q * (sorted.length - 1))] ?? Number.NaN);

const STAGES = [
  "before the Worker",
  "in the Worker",
  "Response to headers",
  "headers to first byte",
] as const;

interface PathSplit {
  path: Path;
  requests: number;
  joined: number;
  ttft: { p50: number; p90: number; p99: number };
  stages: Record<string, { p50: number; p90: number; p99: number; slowestPercentMean: number }>;
}

let results: PathSplit[] = [];
try {
  const key = await createKey(edge.url, adminToken, {
    name: "bench:tail",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  for (const path of PATHS) await phase(path, 8, 2, key);
  const samples: ClientSample[] = [];
  for (const path of PATHS) {
    samples.push(...(await phase(path, CLIENTS, SECONDS, key)));
    await sleep(1500);
  }
  // Stopped before reading: workerd writes the rest of its trace as it stops (the stop in
  // `finally` then finds it gone).
  await edge.stop();
  const runtime = await readTrace(traceFile);
  results = PATHS.map((path) => {
    const mine = samples.filter((s) => s.path === path);
    const joined = mine.flatMap((s) => {
      const r = runtime.get(s.seq);
      if (r === undefined) return [];
      return [
        {
          ttft: s.firstByte - s.sent,
          stages: [
            r.start - s.sent,
            r.response - r.start,
            s.headers - r.response,
            s.firstByte - s.headers,
          ],
        },
      ];
    });
    const sortedTtft = joined.map((j) => j.ttft).toSorted((a, b) => a - b);
    // The slowest 1% by time to first byte, and what each stage took of theirs.
    const slowest = joined
      .toSorted((a, b) => b.ttft - a.ttft)
      .slice(0, Math.max(1, Math.ceil(joined.length / 100)));
    const stages = Object.fromEntries(
      STAGES.map((name, i) => {
        const values = joined.map((j) => j.stages[i] ?? Number.NaN).toSorted((a, b) => a - b);
        const slowMean = slowest.reduce((sum, j) => sum + (j.stages[i] ?? 0), 0) / slowest.length;
        return [
          name,
          {
            p50: quantile(values, 0.5),
            p90: quantile(values, 0.9),
            p99: quantile(values, 0.99),
            slowestPercentMean: slowMean,
          },
        ];
      }),
    );
    return {
      path,
      requests: mine.length,
      joined: joined.length,
      ttft: {
        p50: quantile(sortedTtft, 0.5),
        p90: quantile(sortedTtft, 0.9),
        p99: quantile(sortedTtft, 0.99),
      },
      stages,
    };
  });
} finally {
  await edge.stop();
  await Promise.all(Object.values(origins).map((o) => o.close()));
  await rm(scratch, { recursive: true, force: true });
}

const table = markdownTable(
  ["path", "stage", "p50 ms", "p90 ms", "p99 ms", "slowest 1%: mean ms"],
  results.flatMap((r) => [
    [r.path, "time to first byte", fmt(r.ttft.p50), fmt(r.ttft.p90), fmt(r.ttft.p99), ""],
    ...STAGES.map((name) => {
      const s = r.stages[name];
      return [
        "",
        name,
        fmt(s?.p50 ?? Number.NaN),
        fmt(s?.p90 ?? Number.NaN),
        fmt(s?.p99 ?? Number.NaN),
        fmt(s?.slowestPercentMean ?? Number.NaN),
      ];
    }),
  ]),
);
console.log(
  `${CLIENTS} streaming clients, ${SECONDS} s per path (measured after a ${RAMP_MS} ms ramp), ${MAX_TOKENS} tokens, simulated engine (time scale ${SIM.timeScale}, max_num_seqs ${SIM.maxNumSeqs}); runtime workerd with its async trace.\n`,
);
console.log(table);
console.log(
  `\nrequests joined to the trace: ${results.map((r) => `${r.path} ${r.joined}/${r.requests}`).join(", ")}`,
);
const path = await writeResult("tail", {
  command: benchCommand("bench:tail"),
  date: new Date().toISOString(),
  settings: {
    shards: Number(args.shards),
    timeScale: SIM.timeScale,
    maxNumSeqs: SIM.maxNumSeqs,
    clients: CLIENTS,
    seconds: SECONDS,
    maxTokens: MAX_TOKENS,
    maxBatchSize: Number(args["max-batch-size"]),
  },
  results,
});
console.log(`wrote ${path}`);
