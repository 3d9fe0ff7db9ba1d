/**
 * `npm run bench:failover` (docs/benchmarks.md, "Failover"): one origin of a region fails
 * while steady streaming load runs: it answers errors, then freezes (SIGSTOP), then dies
 * (SIGKILL) and comes back. The same timeline runs once per arm, one after the other: with
 * breakers, with them off, and with no health handling at all (no retries, quarantine,
 * breakers or silence watchdog). Each second is labelled by the fault in force when it
 * began; every target is scored on every arm. Prints the settings in effect and a table,
 * writes bench/results/failover.json and draws bench/results/failover.svg.
 */
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { loadConfig } from "../contracts/config/gateway.ts";
import { batchingPlan } from "../contracts/config/plans.ts";
import {
  fmt,
  markdownTable,
  benchCommand,
  provenance,
  stopOnSignal,
  writeResult,
  writeResultFile,
  setOriginFaults,
} from "./lib.ts";
import { failoverChart } from "./failover-chart.ts";
import { type FailedRequest, countTriedAt } from "./failover-ledger.ts";
import { type PhaseName, type Second, phaseAt, phaseRows, targetsOf } from "./failover-report.ts";
import {
  DEV_KEY_LIMITS,
  type SpawnedOrigin,
  createKey,
  simFlags,
  spawnOrigin,
  startStack,
} from "../scripts/stack.ts";

const { values: args } = parseArgs({
  options: {
    phase: { type: "string", default: "6" },
    freeze: { type: "string", default: "10" },
    concurrency: { type: "string", default: "16" },
    "time-scale": { type: "string", default: "0.1" },
  },
});
const PHASE_S = Number(args.phase);
const FREEZE_S = Number(args.freeze);
const CONCURRENCY = Number(args.concurrency);
const TIME_SCALE = Number(args["time-scale"]);
const MODEL = "warmgate-sim-8b";
const BREAKERS = { slow_first_byte_ms: 1_000, cooldown_ms: 2_000, probes: 2 };

/** The timeline, in order: what happens to the sick origin at the start of each phase. */
const PHASES: { name: PhaseName; seconds: number }[] = [
  { name: "healthy", seconds: PHASE_S },
  { name: "errors", seconds: PHASE_S },
  { name: "calm", seconds: PHASE_S / 2 },
  { name: "frozen", seconds: FREEZE_S },
  { name: "thawed", seconds: PHASE_S / 2 },
  { name: "dead", seconds: PHASE_S },
  { name: "back", seconds: PHASE_S },
];

type Arm = "breakers" | "no-breakers" | "no-health";

/**
 * How each arm configures the edge (`WARMGATE_CONFIG`). `no-breakers` keeps the retries,
 * the quarantine and the silence watchdog; `no-health` turns off all it can: the watchdog
 * (the Batcher cuts a call silent for `slow_first_byte_ms` even with breakers off) only
 * as far as that field's largest value, 600 s.
 */
const ARMS: Record<Arm, { limits?: Record<string, number>; settings: Record<string, unknown> }> = {
  breakers: { settings: { breakers: { enabled: true, ...BREAKERS } } },
  "no-breakers": { settings: { breakers: { enabled: false, ...BREAKERS } } },
  "no-health": {
    limits: { retry_budget: 0, retry_ratio: 0, retry_floor: 0 },
    settings: {
      breakers: { enabled: false, slow_first_byte_ms: 600_000 },
      batching: { origin_quarantine_ms: 0 },
    },
  },
};

/** The health handling an arm's edge runs with, read back from its configuration. */
function settingsInEffect(configText: string) {
  const config = loadConfig(configText);
  const breakers = config.breakers.settings;
  const [region] = config.regions;
  const [model] = config.models;
  const plan = region && model ? batchingPlan(config, region, model.id) : null;
  return {
    breakers: config.breakers.enabled,
    breakerSettings: breakers,
    silenceWatchdogMs: breakers.slowFirstByteMs,
    quarantineMs: plan?.setup.quarantineMs ?? null,
    retryBudget: config.limits.retryBudget,
    retryRatio: config.limits.retryRatio,
    retryFloor: config.limits.retryFloor,
    firstByteTimeoutMs: config.limits.firstByteTimeoutMs,
    requestTimeoutMs: config.limits.requestTimeoutMs,
  };
}
const inEffect = new Map<Arm, ReturnType<typeof settingsInEffect>>();

/** Failed requests the ledger had no record of, per arm (not counted as sent anywhere). */
const unrecorded = new Map<Arm, number>();

/** The kinds of error each arm's clients saw in each phase (in force as they ended), with how often. */
const errorKinds = new Map<string, number>();
function noteError(arm: Arm, phase: PhaseName, what: string): void {
  const key = `${arm}, ${phase}: ${what}`;
  errorKinds.set(key, (errorKinds.get(key) ?? 0) + 1);
}

async function runArm(arm: Arm): Promise<Second[]> {
  const stack = await startStack({
    regions: [{ id: "eu", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 2 }],
    sim: { timeScale: TIME_SCALE },
    originProcesses: true,
    runtime: "workerd",
    ...(ARMS[arm].limits !== undefined && { limits: ARMS[arm].limits }),
    settings: ARMS[arm].settings,
  });
  inEffect.set(arm, settingsInEffect(stack.config));
  // A stopped origin takes no SIGTERM: continue it before stopping.
  const sickChild = (stack.origins[0]?.origin as unknown as SpawnedOrigin | undefined)?.child;
  let replacement: SpawnedOrigin | null = null;
  const stopAll = async () => {
    sickChild?.kill("SIGCONT");
    await Promise.all([stack.stop(), replacement?.close()]);
  };
  const unregister = stopOnSignal(stopAll);
  const seconds: Second[] = [];
  /** When each phase's fault took effect, ms after the start. */
  const starts: { name: PhaseName; at: number }[] = [];
  try {
    const key = await createKey(stack.edgeUrl, stack.adminToken, {
      name: `failover ${arm}`,
      limits: DEV_KEY_LIMITS,
    });
    const sick = stack.origins[0]?.origin as unknown as SpawnedOrigin;
    const sickId = sick.originId;
    const started = Date.now();
    const current = () => {
      const at = Math.floor((Date.now() - started) / 1_000);
      let second = seconds[at];
      if (second === undefined) {
        // Labelled once the run is over, by the fault in force when the second began.
        second = { at, phase: "healthy", arm, latencies: [], errors: 0, toSick: 0, breaker: null };
        seconds[at] = second;
      }
      return second;
    };
    const run = { on: true };
    const failed: FailedRequest[] = [];
    const client = async () => {
      while (run.on) {
        const sentAt = performance.now();
        const bucket = current();
        try {
          const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
            body: JSON.stringify({
              model: MODEL,
              stream: true,
              max_tokens: 16,
              messages: [{ role: "user", content: "Say something short." }],
            }),
            signal: AbortSignal.timeout(60_000),
          });
          const text = await res.text();
          const attempts = Number(res.headers.get("x-warmgate-attempts") ?? "1");
          if (res.headers.get("x-warmgate-origin") === sickId || attempts > 1) bucket.toSick += 1;
          const ok = res.status === 200 && text.endsWith("data: [DONE]\n\n");
          if (ok) bucket.latencies.push(performance.now() - sentAt);
          else {
            // An error counts when the client saw it: a stream a fault cut counts in the fault.
            current().errors += 1;
            // An error answer names no origin: the ledger says where it was tried.
            const requestId = res.headers.get("x-request-id");
            if (res.status !== 200 && requestId !== null) {
              failed.push({ requestId, count: () => (bucket.toSick += 1) });
            }
            noteError(
              arm,
              phaseAt(starts, Date.now() - started),
              `${res.status} ${text.split("\n\n").filter(Boolean).at(-1)?.slice(0, 160)}`,
            );
          }
        } catch (error) {
          current().errors += 1;
          noteError(arm, phaseAt(starts, Date.now() - started), String(error).slice(0, 160));
        }
      }
    };
    const watcher = (async () => {
      while (run.on) {
        await sleep(250);
        if (arm !== "breakers") continue;
        const res = await fetch(`${stack.edgeUrl}/admin/breakers`, {
          headers: { authorization: `Bearer ${stack.adminToken}` },
        }).catch(() => null);
        const body = (await res?.json().catch(() => null)) as {
          data?: { origin: string; state: string }[];
        } | null;
        const state = body?.data?.find((b) => b.origin === sickId)?.state ?? null;
        current().breaker = state;
      }
    })();
    const clients = Array.from({ length: CONCURRENCY }, client);
    for (const step of PHASES) {
      process.stderr.write(`${arm}: ${step.name}\n`);
      await enter(
        step.name,
        sick,
        stack,
        () => replacement,
        (o) => (replacement = o),
      );
      starts.push({ name: step.name, at: Date.now() - started });
      await sleep(step.seconds * 1_000);
    }
    run.on = false;
    await Promise.all([...clients, watcher]);
    unrecorded.set(arm, await countTriedAt(stack.edgeUrl, key, sickId, failed));
  } finally {
    await stopAll();
    unregister();
  }
  return seconds
    .filter((s) => s !== undefined)
    .map((s) => {
      const phase = phaseAt(starts, s.at * 1_000);
      const last = phaseAt(starts, (s.at + 1) * 1_000 - 1);
      return { ...s, phase, next: last === phase ? null : last };
    });
}

// What happens to the sick origin as a phase begins.
async function enter(
  phase: PhaseName,
  sick: SpawnedOrigin,
  stack: Awaited<ReturnType<typeof startStack>>,
  replacement: () => SpawnedOrigin | null,
  replaced: (origin: SpawnedOrigin) => void,
): Promise<void> {
  const faults = (body: unknown) => setOriginFaults(sick.url, stack.originAdminToken, body);
  switch (phase) {
    case "healthy":
      return;
    case "errors":
      await faults({ errorRate: 1, errorStatuses: [500] });
      return;
    case "calm":
      await faults(null);
      return;
    case "frozen":
      sick.child.kill("SIGSTOP");
      return;
    case "thawed":
      sick.child.kill("SIGCONT");
      return;
    case "dead":
      sick.child.kill("SIGKILL");
      return;
    case "back": {
      if (replacement() !== null) return;
      replaced(
        await spawnOrigin([
          ...simFlags({ timeScale: TIME_SCALE }),
          "--origin-id",
          sick.originId,
          "--region",
          "eu",
          "--port",
          new URL(sick.url).port,
          "--access-token",
          stack.originAccessToken,
          "--admin-token",
          stack.originAdminToken,
        ]),
      );
      return;
    }
  }
}

const origin = provenance();
const arms: Arm[] = ["breakers", "no-breakers", "no-health"];
const series: Second[] = [];
for (const arm of arms) series.push(...(await runArm(arm)));

const rows = phaseRows(series, arms, PHASES);
const targets = arms.flatMap((arm) =>
  targetsOf(series, arm, BREAKERS.probes, BREAKERS.cooldown_ms),
);
const command = benchCommand("bench:failover");
console.log(`\n## Failover (\`${command}\`)\n`);
console.log(
  `One region, two origins (simulated engine, time scale ${TIME_SCALE}), ${CONCURRENCY} ` +
    `closed-loop streaming clients; the first origin answers 500s, freezes (SIGSTOP) for ` +
    `${FREEZE_S} s, is killed and started again. Each second is counted in the phase whose ` +
    `fault was in force when it began; a request's latency and where it went count in the ` +
    `second it was sent, an error in the second it reached the client. ` +
    `"Sent to the sick origin": answers it served, or ` +
    `after a failed attempt (\`x-warmgate-attempts\`), and error answers whose ledger record ` +
    `lists an attempt there. Settings in effect, per arm:\n`,
);
console.log(
  markdownTable(
    [
      "arm",
      "breakers",
      "slow_first_byte_ms (silence watchdog)",
      "cooldown_ms",
      "probes",
      "quarantine ms",
      "retry_budget",
      "retry_ratio / floor",
      "first_byte_timeout_ms",
    ],
    arms.map((arm) => {
      const s = inEffect.get(arm);
      if (s === undefined) return [arm];
      return [
        arm,
        s.breakers ? "on" : "off",
        String(s.silenceWatchdogMs),
        String(s.breakerSettings.cooldownMs),
        String(s.breakerSettings.probes),
        String(s.quarantineMs),
        String(s.retryBudget),
        `${s.retryRatio} / ${s.retryFloor}`,
        String(s.firstByteTimeoutMs),
      ];
    }),
  ),
);
console.log();
console.log(
  markdownTable(
    [
      "arm",
      "phase",
      "requests",
      "errors",
      "error %",
      "p50 ms",
      "p99 ms",
      "sent to the sick origin",
    ],
    rows.map((r) => [
      r.arm,
      r.phase,
      String(r.requests),
      String(r.errors),
      fmt(r.errorPct, 2),
      fmt(r.p50),
      fmt(r.p99),
      String(r.toSick),
    ]),
  ),
);
console.log(
  `\n${markdownTable(
    ["arm", "target", "measured", "goal", "met"],
    targets.map((t) => [t.arm, t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  )}`,
);
for (const [kind, n] of errorKinds) console.log(`- ${n} × ${kind}`);
for (const [arm, n] of unrecorded) {
  if (n > 0)
    console.log(
      `- ${arm}: ${n} failed requests had no ledger record (not counted as sent to the sick origin)`,
    );
}
const svg = await failoverChart(series);
const svgPath = await writeResultFile("failover.svg", svg);
const path = await writeResult("failover", {
  command,
  provenance: origin,
  settings: {
    phaseSeconds: PHASE_S,
    freezeSeconds: FREEZE_S,
    concurrency: CONCURRENCY,
    breakers: BREAKERS,
    arms: ARMS,
    inEffect: Object.fromEntries(inEffect),
  },
  phases: rows,
  seconds: series.map(({ latencies, ...rest }) => ({ ...rest, requests: latencies.length })),
  targets,
  errors: Object.fromEntries(errorKinds),
  unrecordedFailures: Object.fromEntries(unrecorded),
});
console.log(`\nwrote ${path} and ${svgPath}`);
