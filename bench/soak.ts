/**
 * `npm run bench:soak` (docs/benchmarks.md, "Memory over a long run"): does the edge's
 * memory level off under a steady load and come back after it? Starts the stack (edge under
 * workerd with its inspector, two simulated origins), reads workerd's RSS and the isolate's
 * JS heap every 10 s through an idle minute, `--minutes` of steady mixed traffic from
 * `--keys` keys and a thousand end users (JSON, streams, cancelled streams, embeddings), and
 * two minutes after; takes a heap snapshot before and after the load and prints what grew.
 * Writes bench/results/soak.json.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import {
  benchCommand,
  fmt,
  markdownTable,
  stopOnSignal,
  targetsTable,
  writeResult,
} from "./lib.ts";
import { BENCH_KEY_LIMITS } from "./key-limits.ts";
import { type Inspector, inspectWorker } from "./inspector.ts";
import { heapBytes, heapGrowth, summarizeHeap, type HeapSummary } from "./heap-summary.ts";
import { residentBytes, workerdPid } from "./processes.ts";
import { type MemorySample, type SoakPhase, soakTargets } from "./soak-report.ts";
import { createKey, startStack } from "../scripts/stack.ts";
import { freePort } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    minutes: { type: "string", default: "30" },
    rate: { type: "string", default: "40" },
    keys: { type: "string", default: "20" },
    "settle-minutes": { type: "string", default: "5" },
    "after-seconds": { type: "string", default: "120" },
    "snapshots-to": { type: "string" },
  },
  strict: true,
});
const LOAD_MS = Number(args.minutes) * 60_000;
const RATE = Number(args.rate);
const SETTLE_S = Math.min(Number(args["settle-minutes"]) * 60, LOAD_MS / 2000);

const inspectorPort = await freePort();
const stack = await startStack({
  regions: [{ id: "local", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 2 }],
  sim: { timeScale: 0.05 },
  originProcesses: true,
  runtime: "workerd",
  inspectorPort,
});
const unregister = stopOnSignal(() => stack.stop());

async function heapSnapshot(inspector: Inspector, name: string): Promise<HeapSummary> {
  // A snapshot collects garbage first (workerd does not answer `collectGarbage`).
  const chunks: string[] = [];
  inspector.on("HeapProfiler.addHeapSnapshotChunk", (p) => {
    chunks.push((p as { chunk: string }).chunk);
  });
  await inspector.send("HeapProfiler.takeHeapSnapshot", { reportProgress: false });
  const text = chunks.join("");
  if (args["snapshots-to"] !== undefined) {
    await writeFile(join(args["snapshots-to"], `${name}.heapsnapshot`), text);
  }
  const summary = summarizeHeap(JSON.parse(text));
  chunks.length = 0;
  return summary;
}

/** The n-th request of the mix: most are short chats, some stream, some are cut by the client. */
function request(
  n: number,
  keys: string[],
): { path: string; body: unknown; key: string; cancel: boolean } {
  const key = keys[n % keys.length] ?? "";
  const user = `user-${n % 1000}`;
  const messages = [
    { role: "system", content: "You are a concise assistant." },
    { role: "user", content: `Question ${n % 500}: say something about the number ${n % 97}.` },
  ];
  const kind = n % 10;
  if (kind === 9)
    return {
      path: "embeddings",
      body: { model: "warmgate-sim-embed", input: `text ${n}` },
      key,
      cancel: false,
    };
  const stream = kind >= 5;
  return {
    path: "chat/completions",
    body: { model: "warmgate-sim-8b", messages, max_tokens: kind === 8 ? 200 : 24, stream, user },
    key,
    cancel: kind === 8,
  };
}

async function send(n: number, keys: string[], counts: Map<string, number>): Promise<void> {
  const { path, body, key, cancel } = request(n, keys);
  const controller = new AbortController();
  let outcome = "error";
  try {
    const res = await fetch(`${stack.edgeUrl}/v1/${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    const reader = res.body?.getReader();
    let chunks = 0;
    for (;;) {
      if (!reader) break;
      const { done } = await reader.read();
      if (done) break;
      if (cancel && ++chunks === 3) {
        controller.abort();
        break;
      }
    }
    outcome = cancel && chunks >= 3 ? "cancelled" : String(res.status);
  } catch {
    outcome = cancel ? "cancelled" : "error";
  }
  counts.set(outcome, (counts.get(outcome) ?? 0) + 1);
}

const samples: MemorySample[] = [];
const started = performance.now();
let result: Record<string, unknown>;
try {
  const keys = await Promise.all(
    Array.from({ length: Number(args.keys) }, (_, i) =>
      createKey(stack.edgeUrl, stack.adminToken, { name: `soak-${i}`, limits: BENCH_KEY_LIMITS }),
    ),
  );
  const counts = new Map<string, number>();
  // A few requests first, so the idle level includes the loaded code.
  for (let n = 0; n < 20; n++) await send(n, keys, counts);
  const inspector = await inspectWorker(inspectorPort);
  const pid = await workerdPid(stack.edge.pid);
  if (pid === null) throw new Error("no workerd process found");
  const read = async (phase: SoakPhase) => {
    const heap = await inspector.send<{ usedSize: number; totalSize: number }>(
      "Runtime.getHeapUsage",
    );
    const resident = await residentBytes(pid);
    samples.push({
      t: (performance.now() - started) / 1000,
      phase,
      rssBytes: resident?.rss ?? Number.NaN,
      anonBytes: resident?.anon ?? Number.NaN,
      heapBytes: heap.usedSize,
      heapTotalBytes: heap.totalSize,
    });
  };
  let phase: SoakPhase = "idle";
  const sampler = setInterval(() => void read(phase), 10_000);
  console.error("idle minute…");
  await sleep(50_000);
  const before = await heapSnapshot(inspector, "before");
  console.error(`heap before: ${fmt(heapBytes(before) / 1024 / 1024, 1)} MB; load…`);
  await sleep(10_000);
  phase = "load";
  const loadStart = performance.now();
  let n = 20;
  const inFlight = new Set<Promise<void>>();
  while (performance.now() - loadStart < LOAD_MS) {
    const due = Math.floor(((performance.now() - loadStart) / 1000) * RATE);
    while (n - 20 < due) {
      const p = send(n++, keys, counts).finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
    await sleep(5);
  }
  await Promise.all(inFlight);
  await read("load");
  phase = "after";
  await sleep(Number(args["after-seconds"]) * 1000);
  await read("after");
  clearInterval(sampler);
  const after = await heapSnapshot(inspector, "after");
  inspector.close();
  const { figures, targets } = soakTargets(samples, SETTLE_S);
  const growth = heapGrowth(before, after, 12);
  console.log(
    `\n${n - 20} requests at ${RATE}/s for ${args.minutes} min from ${keys.length} keys: ${[...counts].map(([k, v]) => `${k} ${v}`).join(", ")}\n`,
  );
  console.log(
    markdownTable(
      ["figure", "MB"],
      Object.entries(figures).map(([k, v]) => [k, fmt(v, 1)]),
    ),
  );
  console.log(
    "\nheap snapshot after the idle minute and two minutes after the load (self sizes):\n",
  );
  console.log(
    markdownTable(
      ["kind", "before KB", "after KB", "objects added"],
      growth.map((g) => [g.kind, fmt(g.before / 1024, 0), fmt(g.after / 1024, 0), String(g.count)]),
    ),
  );
  console.log(
    `\ntotal ${fmt(heapBytes(before) / 1024 / 1024, 1)} → ${fmt(heapBytes(after) / 1024 / 1024, 1)} MB\n`,
  );
  console.log(targetsTable(targets));
  result = {
    command: benchCommand("bench:soak"),
    requests: n - 20,
    outcomes: Object.fromEntries(counts),
    figures,
    heapGrowth: growth,
    samples,
    targets,
  };
} finally {
  unregister();
  await stack.stop();
}
console.log(`\nwrote ${await writeResult("soak", result)}`);
