/**
 * `npm run bench:burst` (docs/benchmarks.md, "Burst"): bursts of concurrent streams at the
 * edge with real origin processes (two per region), on healthy origins and with one frozen,
 * each followed by single requests; poison requests among ordinary traffic; the edge
 * restarted while a breaker cools down; and bursts past the origins' connection cap
 * (`burst-capped.ts`). Every request is classified (served whole, refused
 * at once, cut after its first byte, no answer); breakers are read around and during each
 * phase. Prints tables, writes bench/results/burst.json with a `targets` list. `--quick`
 * is a smoke run.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { DEFAULT_BREAKER_SETTINGS } from "../contracts/config/breakers.ts";
import { loadConfig } from "../contracts/config/gateway.ts";
import { PROBE_INTERVAL_MS } from "../durable-objects/origin-breakers/types.ts";
import { parseRuntime } from "../scripts/edge.ts";
import {
  DEFAULT_REGIONS,
  DEV_KEY_LIMITS,
  type SpawnedOrigin,
  createKey,
  startStack,
} from "../scripts/stack.ts";
import { tally } from "./burst-client.ts";
import {
  type BurstContext,
  type BurstRun,
  POISON_DEPTH,
  burst,
  poison,
  restart,
  singles,
} from "./burst-phases.ts";
import { cappedPhase } from "./burst-capped.ts";
import { burstTable, burstTargets, errorLines, poisonTable, targetTable } from "./burst-report.ts";
import { benchCommand, fmt, provenance, resultName, stopOnSignal, writeResult } from "./lib.ts";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    bursts: { type: "string" },
    "frozen-bursts": { type: "string" },
    "series-s": { type: "string" },
    baseline: { type: "string" },
    poison: { type: "string", default: "10" },
    "poison-s": { type: "string" },
    "poison-clients": { type: "string" },
    "cooldown-ms": { type: "string", default: "15000" },
    "time-scale": { type: "string", default: "1" },
    "request-timeout-s": { type: "string", default: "120" },
    "freeze-max-s": { type: "string" },
    runtime: { type: "string", default: "workerd" },
    "capped-bursts": { type: "string" },
    "max-connections": { type: "string" },
    "only-capped": { type: "boolean", default: false },
  },
  strict: true,
});
const quick = args.quick;
const list = (raw: string) => raw.split(",").filter(Boolean).map(Number);
const ONLY_CAPPED = args["only-capped"];
const BURSTS = ONLY_CAPPED ? [] : list(args.bursts ?? (quick ? "50,100" : "250,500,1000,2000"));
const FROZEN_BURSTS = ONLY_CAPPED
  ? []
  : list(args["frozen-bursts"] ?? (quick ? "100" : BURSTS.join(",")));
const SERIES_S = Number(args["series-s"] ?? (quick ? 5 : 60));
const BASELINE = Number(args.baseline ?? (quick ? 10 : 30));
const POISON = Number(args.poison);
const POISON_S = Number(args["poison-s"] ?? (quick ? 10 : 30));
const POISON_CLIENTS = Number(args["poison-clients"] ?? (quick ? 4 : 8));
const COOLDOWN_MS = Number(args["cooldown-ms"]);
const TIME_SCALE = Number(args["time-scale"]);
const FREEZE_MAX_S = Number(args["freeze-max-s"] ?? (quick ? 10 : 30));
const RUNTIME = parseRuntime(args.runtime);
const CAPPED_BURSTS = list(args["capped-bursts"] ?? (quick ? "40" : "160,200"));
const MAX_CONNECTIONS = Number(args["max-connections"] ?? (quick ? 8 : 32));
const BREAKERS = { cooldown_ms: COOLDOWN_MS };
const log = (line: string) => console.error(line);
const origin = provenance();

const state = await mkdtemp(join(tmpdir(), "warmgate-burst-"));
const stack = await startStack({
  regions: DEFAULT_REGIONS,
  sim: { timeScale: TIME_SCALE },
  originProcesses: true,
  runtime: RUNTIME,
  // The restart phase starts the edge again on this state.
  persistTo: state,
  settings: { breakers: BREAKERS },
}).catch(async (error: unknown) => {
  await rm(state, { recursive: true, force: true });
  throw error;
});
const spawned = () => stack.origins.map((o) => o.origin as unknown as SpawnedOrigin);
// A stopped origin takes no SIGTERM: continue every origin before stopping them.
const stopAll = async () => {
  for (const o of spawned()) o.child.kill("SIGCONT");
  await stack.stop();
  await rm(state, { recursive: true, force: true });
};
const unregister = stopOnSignal(stopAll);

const config = loadConfig(stack.config);
const breakerSettings = config.breakers.settings;
const settings = {
  runtime: RUNTIME,
  timeScale: TIME_SCALE,
  origins: stack.origins.map((o) => `${o.region}:${o.origin.originId}`),
  keyLimits: DEV_KEY_LIMITS,
  limits: config.limits,
  lanes:
    (JSON.parse(stack.config) as { batching?: { lanes?: unknown } }).batching?.lanes ??
    "(defaults)",
  breakers: { enabled: config.breakers.enabled, ...breakerSettings },
  probeIntervalMs: PROBE_INTERVAL_MS,
  bursts: BURSTS,
  frozenBursts: FROZEN_BURSTS,
  seriesSeconds: SERIES_S,
  baselineRequests: BASELINE,
  poison: { count: POISON, depth: POISON_DEPTH, seconds: POISON_S, clients: POISON_CLIENTS },
  freezeMaxSeconds: FREEZE_MAX_S,
  capped: { bursts: CAPPED_BURSTS, maxConnections: MAX_CONNECTIONS, batching: false },
};

const context = {
  seriesSeconds: SERIES_S,
  requestTimeoutMs: Number(args["request-timeout-s"]) * 1_000,
  closeWaitMs: breakerSettings.maxCooldownMs + 10_000,
  freezeMaxMs: FREEZE_MAX_S * 1_000,
  log,
};
let report;
try {
  const key = await createKey(stack.edgeUrl, stack.adminToken, {
    name: "burst",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
  const ctx: BurstContext = { ...context, stack, key };
  await singles(ctx, { count: 5 });
  const baseline = await singles(ctx, { count: BASELINE });
  const baselineP50 = tally(baseline).ttftP50;
  log(`burst: pre-burst TTFT p50 ${fmt(baselineP50, 1)} ms`);
  const runs: BurstRun[] = [];
  for (const size of BURSTS) runs.push(await burst(ctx, size, null));
  const frozen = spawned().find((o) => o.originId === "eu-1") ?? null;
  for (const size of FROZEN_BURSTS) runs.push(await burst(ctx, size, frozen));
  const poisoned =
    POISON > 0 && !ONLY_CAPPED
      ? await poison(ctx, { count: POISON, seconds: POISON_S, clients: POISON_CLIENTS })
      : null;
  const target = frozen ?? spawned()[0];
  const restarted =
    target === undefined || ONLY_CAPPED
      ? null
      : await restart(ctx, target, Math.max(60_000, 4 * breakerSettings.maxCooldownMs));
  report = { baseline, baselineP50, runs, poisoned, restarted };
} finally {
  await stopAll();
  unregister();
}
const capped =
  CAPPED_BURSTS.length === 0
    ? null
    : await cappedPhase({
        sizes: CAPPED_BURSTS,
        maxConnections: MAX_CONNECTIONS,
        baseline: BASELINE,
        runtime: RUNTIME,
        timeScale: TIME_SCALE,
        breakers: BREAKERS,
        context,
      });

const { baseline, baselineP50, runs, poisoned, restarted } = report;
const targets = burstTargets(
  runs,
  baselineP50,
  poisoned,
  restarted,
  (cooldownMs) => cooldownMs + 2 * PROBE_INTERVAL_MS,
  capped,
);
const command = benchCommand("bench:burst");
console.log(`\n## Burst (\`${command}\`)\n`);
console.log(
  `Two regions of two origin processes each (simulated engine, time scale ${TIME_SCALE}), ` +
    `the edge under ${RUNTIME}; streamed chat, max_tokens 16, half of each burst to each ` +
    `region. Breakers: ${JSON.stringify(settings.breakers)} (defaults ${JSON.stringify(DEFAULT_BREAKER_SETTINGS)}), ` +
    `probe interval ${PROBE_INTERVAL_MS} ms; limits ${JSON.stringify(config.limits)}. ` +
    `Pre-burst TTFT p50 ${fmt(baselineP50, 1)} ms over ${tally(baseline).whole} single requests; ` +
    `${SERIES_S} s of single requests after each burst.\n`,
);
if (runs.length > 0) console.log(burstTable(runs, baselineP50));
if (capped !== null) {
  console.log(
    `\nOrigins capped at ${capped.maxConnections} connections (\`--max-connections\`), batching off ` +
      `(a connection per request); pre-burst TTFT p50 ${fmt(capped.baselineP50, 1)} ms. The origins ` +
      `answered ${capped.refused.busy} connections busy (503) and closed ${capped.refused.closed} unanswered.\n`,
  );
  console.log(burstTable(capped.runs, capped.baselineP50));
}
if (poisoned !== null) {
  console.log(
    `\nPoison: ${POISON} requests with a schema ${POISON_DEPTH} levels deep among ${POISON_S} s of ${POISON_CLIENTS} clients' traffic.\n`,
  );
  console.log(poisonTable(poisoned));
  const windows = (poisoned.breakers.after ?? []).map(
    (v) => `${v.origin} ${v.failures}/${v.requests}`,
  );
  console.log(`\nBreaker windows after it (failures/requests): ${windows.join(", ") || "–"}.`);
}
if (restarted !== null) {
  const r = restarted;
  const at = (t: number | null) =>
    t === null || r.openedAt === null ? "–" : `${t - r.openedAt} ms`;
  console.log(
    `\nRestart: ${r.origin} tripped after ${r.tripRequests} requests; cooldown ${r.cooldownMs} ms; ` +
      `edge killed at ${at(r.restartBegan)} after the opening and answering again at ${at(r.restartEnded)}; ` +
      `breaker states after: ${r.states.map((s) => `${s.state} at ${s.atMs} ms`).join(", ") || "–"}; ` +
      `${r.requests.length} single requests; the first served whole by ${r.origin} ` +
      `${r.fullServiceMs === null ? "never" : `was sent ${fmt(r.fullServiceMs, 0)} ms`} after the opening.` +
      (r.note === null ? "" : ` Note: ${r.note}.`),
  );
}
console.log(`\n${targetTable(targets)}\n`);
const lines = [
  ...errorLines("pre-burst", baseline),
  ...runs.flatMap((r) => [
    ...errorLines(`${r.phase} burst of ${r.size}`, r.burst),
    ...errorLines(`${r.phase} burst of ${r.size}, singles after`, r.after),
  ]),
  ...(poisoned === null
    ? []
    : [
        ...errorLines("poison", poisoned.poison),
        ...errorLines("ordinary among poison", poisoned.ordinary),
      ]),
];
for (const r of capped?.runs ?? []) {
  lines.push(...errorLines(`capped burst of ${r.size}`, r.burst));
  lines.push(...errorLines(`capped burst of ${r.size}, singles after`, r.after));
}
for (const line of lines) console.log(line);

/** TTFT of the first five single requests after a burst: whether a slow first one is alone. */
function firstTtfts(after: readonly { ttftMs: number | null }[]): (number | null)[] {
  return after.slice(0, 5).map((o) => (o.ttftMs === null ? null : Math.round(o.ttftMs * 10) / 10));
}

const path = await writeResult(resultName("burst", RUNTIME), {
  command,
  provenance: origin,
  settings,
  baseline: { p50TtftMs: baselineP50, tally: tally(baseline) },
  runs: runs.map((r) => ({
    phase: r.phase,
    size: r.size,
    frozen: r.frozen,
    burstSeconds: r.burstSeconds,
    burst: tally(r.burst),
    firstSingleAfter: r.after[0] ?? null,
    firstSinglesTtftMs: firstTtfts(r.after),
    singlesAfter: tally(r.after),
    breakers: r.breakers,
  })),
  poison:
    poisoned === null
      ? null
      : {
          poison: poisoned.poison,
          ordinary: tally(poisoned.ordinary),
          breakers: poisoned.breakers,
        },
  restart: restarted,
  capped:
    capped === null
      ? null
      : {
          maxConnections: capped.maxConnections,
          baselineP50: capped.baselineP50,
          refused: capped.refused,
          runs: capped.runs.map((r) => ({
            size: r.size,
            burstSeconds: r.burstSeconds,
            burst: tally(r.burst),
            firstSingleAfter: r.after[0] ?? null,
            firstSinglesTtftMs: firstTtfts(r.after),
            singlesAfter: tally(r.after),
            breakers: r.breakers,
          })),
        },
  targets,
});
console.error(`wrote ${path}`);
