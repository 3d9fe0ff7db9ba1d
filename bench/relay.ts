/**
 * `npm run bench:relay`: what it costs to get a Durable Object's byte stream to a client,
 * three ways, alternating in one run (bench/relay/worker.ts): the Worker reading the
 * object's stream chunk by chunk into its response (`read`), the Worker handing the object
 * its response's writable side (`handoff`), and the Worker making the object's stream its
 * response body as it is (`pass`, how the edge takes a Batcher's body stream). The same
 * workerd thread runs both sides, so its CPU per request is what each design costs in
 * all. Prints a table and writes bench/results/relay.json.
 * See docs/benchmarks.md.
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { benchCommand, closedLoop, fmt, markdownTable, writeResult } from "./lib.ts";
import { cpuTimeMs, workerdPid } from "./processes.ts";
import { ROOT, startWorkerd } from "../scripts/edge.ts";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "4" },
    requests: { type: "string", default: "1500" },
    concurrency: { type: "string", default: "32" },
  },
  strict: true,
});
const ROUNDS = Number(args.rounds);
const REQUESTS = Number(args.requests);
const CONCURRENCY = Number(args.concurrency);
const CHUNKS = [1, 16, 64];
type Design = "read" | "handoff" | "pass";
const DESIGNS: Design[] = ["read", "handoff", "pass"];

const worker = await startWorkerd({
  config: join(ROOT, "bench", "relay", "wrangler.toml"),
  vars: {},
});

/** CPU time (ms) of the Worker's workerd so far, or null. */
async function workerdCpuMs(): Promise<number | null> {
  return cpuTimeMs(await workerdPid(worker.child.pid));
}

async function run(design: Design, chunks: number, requests: number) {
  const before = await workerdCpuMs();
  const result = await closedLoop(CONCURRENCY, requests, async () => {
    const started = performance.now();
    const res = await fetch(`${worker.url}/${design}?n=${chunks}`);
    const body = await res.arrayBuffer();
    if (res.status !== 200 || body.byteLength === 0) throw new Error(`status ${res.status}`);
    return performance.now() - started;
  });
  const after = await workerdCpuMs();
  const cpuMs = before === null || after === null ? Number.NaN : after - before;
  return { ...result, cpuMs };
}

interface Row {
  chunks: number;
  design: Design;
  rps: number;
  cpuMsPerRequest: number;
  errors: number;
}
const rows: Row[] = [];
try {
  for (const design of DESIGNS) await run(design, 16, 500);
  for (const chunks of CHUNKS) {
    const totals = new Map<
      Design,
      { requests: number; seconds: number; cpuMs: number; errors: number }
    >();
    for (let round = 0; round < ROUNDS; round++) {
      for (const design of round % 2 === 0 ? DESIGNS : DESIGNS.toReversed()) {
        const r = await run(design, chunks, Math.ceil(REQUESTS / ROUNDS));
        const t = totals.get(design) ?? { requests: 0, seconds: 0, cpuMs: 0, errors: 0 };
        totals.set(design, {
          requests: t.requests + r.requests - r.errors,
          seconds: t.seconds + r.seconds,
          cpuMs: t.cpuMs + r.cpuMs,
          errors: t.errors + r.errors,
        });
      }
    }
    for (const design of DESIGNS) {
      const t = totals.get(design);
      if (t === undefined) continue;
      rows.push({
        chunks,
        design,
        rps: t.requests / t.seconds,
        cpuMsPerRequest: t.cpuMs / t.requests,
        errors: t.errors,
      });
    }
  }
} finally {
  await worker.stop();
}

const perChunk = (design: Design) => {
  const few = rows.find((r) => r.design === design && r.chunks === 16);
  const many = rows.find((r) => r.design === design && r.chunks === 64);
  return few && many ? ((many.cpuMsPerRequest - few.cpuMsPerRequest) / 48) * 1000 : Number.NaN;
};
const command = benchCommand("bench:relay");
console.log(`\n## Relaying a Durable Object's stream (\`${command}\`)\n`);
console.log(
  markdownTable(
    ["chunks", "design", "req/s", "workerd CPU ms/request", "errors"],
    rows.map((r) => [
      String(r.chunks),
      r.design,
      fmt(r.rps, 0),
      fmt(r.cpuMsPerRequest, 3),
      String(r.errors),
    ]),
  ),
);
console.log(
  `\nCPU per chunk (16 to 64 chunks): ${DESIGNS.map((d) => `${d} ${fmt(perChunk(d), 1)} µs`).join(", ")}`,
);
const path = await writeResult("relay", {
  command,
  settings: { rounds: ROUNDS, requests: REQUESTS, concurrency: CONCURRENCY, chunks: CHUNKS },
  rows,
  cpuUsPerChunk: Object.fromEntries(DESIGNS.map((d) => [d, perChunk(d)])),
});
console.log(`wrote ${path}`);
