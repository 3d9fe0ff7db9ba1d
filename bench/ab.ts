/**
 * `npm run bench:ab -- --base REV [--stream] [--prompt-tokens N] [--max-tokens N]
 * [--time-scale X] [--clients N]`: this tree's edge and the edge of
 * commit REV side by side, each under workerd with an origin of its own, one request to each
 * in turn (a key with limits, budgets and ledger on); prints each edge's workerd CPU and
 * latency per round. A host that drifts moves both alike, so a difference of a few percent
 * shows where runs one after the other would bury it. REV is checked out in a temporary
 * worktree. Prints only: the targets live in bench:overhead. See docs/benchmarks.md, "Where
 * one request's CPU goes".
 */
import { execFileSync } from "node:child_process";
import { mkdtemp, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { benchChatBody } from "./chat-body.ts";
import { closedLoop, fmt, markdownTable, percentile, provenance, timedRequest } from "./lib.ts";
import { BENCH_KEY_BUDGETS, BENCH_KEY_LIMITS } from "./key-limits.ts";
import { cpuTimeMs, workerdPid } from "./processes.ts";
import { ROOT } from "../scripts/edge.ts";
import type * as StackModule from "../scripts/stack.ts";

const { values: args } = parseArgs({
  options: {
    base: { type: "string" },
    rounds: { type: "string", default: "4" },
    requests: { type: "string", default: "1500" },
    warm: { type: "string", default: "300" },
    stream: { type: "boolean", default: false },
    "prompt-tokens": { type: "string", default: "0" },
    "max-tokens": { type: "string", default: "16" },
    // The simulated engine's speed: 0 answers at once, 1 at a modelled GPU's pace.
    "time-scale": { type: "string", default: "0" },
    // More than one: each edge in turn serves a round's requests from this many clients.
    clients: { type: "string", default: "1" },
  },
  strict: true,
});
if (args.base === undefined) throw new Error("--base REV names the commit to compare with");
const ROUNDS = Number(args.rounds);
const REQUESTS = Number(args.requests);
const CLIENTS = Number(args.clients);

const git = (...rest: string[]) =>
  execFileSync("git", rest, { cwd: ROOT, encoding: "utf8" }).trim();
const baseCommit = git("rev-parse", "--short", args.base);
// This tree as every result names it (bench/lib.ts).
const { commit: headCommit, dirty } = provenance();
const scratch = await mkdtemp(join(tmpdir(), "warmgate-ab-"));
const baseDir = join(scratch, "base");
git("worktree", "add", "--detach", baseDir, baseCommit);
await symlink(join(ROOT, "node_modules"), join(baseDir, "node_modules"));

interface Edge {
  name: string;
  stack: StackModule.RunningStack;
  url: string;
  headers: Record<string, string>;
  pid: number | null;
  rounds: number[];
  latencies: number[];
  /** Requests a second, one figure a round (with clients). */
  rps: number[];
}

const edges: Edge[] = [];
try {
  for (const [name, dir] of [
    [`base ${baseCommit}`, baseDir],
    [`this tree (${headCommit?.slice(0, 7) ?? "?"}${dirty === true ? ", changed" : ""})`, ROOT],
  ] as const) {
    const { startStack, createKey } = (await import(
      join(dir, "scripts", "stack.ts")
    )) as typeof StackModule;
    const stack = await startStack({
      regions: [
        { id: "local", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 1 },
      ],
      sim: { timeScale: Number(args["time-scale"]) },
      originProcesses: true,
      runtime: "workerd",
    });
    const key = await createKey(stack.edgeUrl, stack.adminToken, {
      name: "bench-ab",
      limits: BENCH_KEY_LIMITS,
      budgets: BENCH_KEY_BUDGETS,
    });
    edges.push({
      name,
      stack,
      url: `${stack.edgeUrl}/v1/chat/completions`,
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      pid: await workerdPid(stack.edge.pid),
      rounds: [],
      latencies: [],
      rps: [],
    });
  }
  const payload = benchChatBody(
    Number(args["max-tokens"]),
    args.stream,
    Number(args["prompt-tokens"]),
  );
  for (let i = 0; i < Number(args.warm); i++) {
    for (const edge of edges) await timedRequest(edge.url, edge.headers, payload);
  }
  const measure = CLIENTS > 1 ? measureLoaded : measurePaired;
  for (let round = 0; round < ROUNDS; round++) await measure(round);
  async function measureLoaded(round: number) {
    // Each edge serves the round alone from the clients, each going first every other round.
    for (const edge of round % 2 === 0 ? edges : edges.toReversed()) {
      const before = await cpuTimeMs(edge.pid);
      const load = await closedLoop(CLIENTS, REQUESTS, async () => {
        const { total } = await timedRequest(edge.url, edge.headers, payload);
        edge.latencies.push(total);
        return total;
      });
      const after = await cpuTimeMs(edge.pid);
      edge.rounds.push(((after ?? NaN) - (before ?? NaN)) / REQUESTS);
      edge.rps.push(load.rps);
    }
  }
  async function measurePaired() {
    const before = await Promise.all(edges.map((edge) => cpuTimeMs(edge.pid)));
    for (let i = 0; i < REQUESTS; i++) {
      // Each goes first every other turn.
      for (const edge of i % 2 === 0 ? edges : edges.toReversed()) {
        edge.latencies.push((await timedRequest(edge.url, edge.headers, payload)).total);
      }
    }
    const after = await Promise.all(edges.map((edge) => cpuTimeMs(edge.pid)));
    edges.forEach((edge, k) =>
      edge.rounds.push(((after[k] ?? NaN) - (before[k] ?? NaN)) / REQUESTS),
    );
  }
} finally {
  await Promise.all(edges.map((edge) => edge.stack.stop()));
  git("worktree", "remove", "--force", baseDir);
  await rm(scratch, { recursive: true, force: true });
}

const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
for (const edge of edges) edge.latencies.sort((a, b) => a - b);
const [base, head] = edges;
console.log(
  `${ROUNDS} rounds of ${REQUESTS} ${args.stream ? "streamed" : "JSON"} requests to each edge, in turn, ${CLIENTS === 1 ? "one client" : `${CLIENTS} clients`}` +
    (args["prompt-tokens"] === "0" ? "" : `, ${args["prompt-tokens"]}-token prompt`) +
    `, ${args["max-tokens"]} tokens at time scale ${args["time-scale"]}.\n`,
);
console.log(
  markdownTable(
    [
      "edge",
      ...(edges[0]?.rounds ?? []).map((_, r) => `round ${r + 1} CPU ms/req`),
      "CPU ms/req",
      "p50 ms",
      "p99 ms",
      ...(CLIENTS > 1 ? ["req/s"] : []),
    ],
    edges.map((edge) => [
      edge.name,
      ...edge.rounds.map((ms) => fmt(ms, 3)),
      fmt(mean(edge.rounds), 3),
      fmt(percentile(edge.latencies, 50)),
      fmt(percentile(edge.latencies, 99)),
      ...(CLIENTS > 1 ? [fmt(mean(edge.rps), 0)] : []),
    ]),
  ),
);
if (base !== undefined && head !== undefined) {
  console.log(
    `\nthis tree / base: CPU ${fmt(mean(head.rounds) / mean(base.rounds), 3)}×, p50 ${fmt(percentile(head.latencies, 50) / percentile(base.latencies, 50), 3)}×` +
      (CLIENTS > 1 ? `, req/s ${fmt(mean(head.rps) / mean(base.rps), 3)}×` : ""),
  );
}
