/**
 * `npm run bench:failover` (docs/benchmarks.md, "Failover"): one origin of a region fails
 * while steady streaming load runs: it answers errors, then freezes (SIGSTOP), then dies
 * (SIGKILL) and comes back. The same timeline runs twice, on one machine, one arm after the
 * other: with breakers and with them off. Per second: requests, client-visible errors,
 * p50/p99 latency and requests sent to the sick origin. Prints a table, writes
 * bench/results/failover.json and draws bench/results/failover.svg.
 */
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { fmt, markdownTable, benchCommand, writeResult, writeResultFile } from "./lib.ts";
import { failoverChart } from "./failover-chart.ts";
import { type PhaseName, type Second, phaseRows, targetsOf } from "./failover-report.ts";
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

type Arm = "breakers" | "no-breakers";

/** The kinds of error each arm's clients saw, with how often. */
const errorKinds = new Map<string, number>();
function noteError(arm: Arm, what: string): void {
  const key = `${arm}: ${what}`;
  errorKinds.set(key, (errorKinds.get(key) ?? 0) + 1);
}

async function runArm(arm: Arm): Promise<Second[]> {
  const stack = await startStack({
    regions: [{ id: "eu", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 2 }],
    sim: { timeScale: TIME_SCALE },
    originProcesses: true,
    runtime: "workerd",
    settings: { breakers: { enabled: arm === "breakers", ...BREAKERS } },
  });
  const seconds: Second[] = [];
  try {
    const key = await createKey(stack.edgeUrl, stack.adminToken, {
      name: `failover ${arm}`,
      limits: DEV_KEY_LIMITS,
    });
    const sick = stack.origins[0]?.origin as unknown as SpawnedOrigin;
    const sickId = sick.originId;
    const started = Date.now();
    let phase: PhaseName = "healthy";
    const current = () => {
      const at = Math.floor((Date.now() - started) / 1_000);
      let second = seconds[at];
      if (second === undefined) {
        second = { at, phase, arm, latencies: [], errors: 0, toSick: 0, breaker: null };
        seconds[at] = second;
      }
      return second;
    };
    const run = { on: true };
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
            bucket.errors += 1;
            noteError(
              arm,
              `${res.status} ${text.split("\n\n").filter(Boolean).at(-1)?.slice(0, 160)}`,
            );
          }
        } catch (error) {
          bucket.errors += 1;
          noteError(arm, String(error).slice(0, 160));
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
    let replacement: SpawnedOrigin | null = null;
    for (const step of PHASES) {
      phase = step.name;
      process.stderr.write(`${arm}: ${phase}\n`);
      await enter(
        step.name,
        sick,
        stack,
        () => replacement,
        (o) => (replacement = o),
      );
      await sleep(step.seconds * 1_000);
    }
    run.on = false;
    await Promise.all([...clients, watcher]);
    await (replacement as SpawnedOrigin | null)?.close();
  } finally {
    await stack.stop();
  }
  return seconds.filter((s) => s !== undefined);
}

// What happens to the sick origin as a phase begins.
async function enter(
  phase: PhaseName,
  sick: SpawnedOrigin,
  stack: Awaited<ReturnType<typeof startStack>>,
  replacement: () => SpawnedOrigin | null,
  replaced: (origin: SpawnedOrigin) => void,
): Promise<void> {
  const faults = (body: unknown) =>
    fetch(`${sick.url}/admin/faults`, {
      method: body === null ? "DELETE" : "PUT",
      headers: {
        authorization: `Bearer ${stack.originAdminToken}`,
        "content-type": "application/json",
      },
      ...(body !== null && { body: JSON.stringify(body) }),
    }).then((r) => r.arrayBuffer());
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

const arms: Arm[] = ["breakers", "no-breakers"];
const series: Second[] = [];
for (const arm of arms) series.push(...(await runArm(arm)));

const rows = phaseRows(series, arms, PHASES);
const targets = targetsOf(series, BREAKERS.probes);
const command = benchCommand("bench:failover");
console.log(`\n## Failover (\`${command}\`)\n`);
console.log(
  `One region, two origins (simulated engine, time scale ${TIME_SCALE}), ${CONCURRENCY} ` +
    `closed-loop streaming clients; the first origin answers 500s, freezes (SIGSTOP) for ` +
    `${FREEZE_S} s, is killed and started again. Breakers: ` +
    `slow_first_byte_ms ${BREAKERS.slow_first_byte_ms}, cooldown_ms ${BREAKERS.cooldown_ms}, ` +
    `probes ${BREAKERS.probes}; first_byte_timeout_ms 30000 (the default) in both arms.\n`,
);
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
    ["target", "measured", "goal", "met"],
    targets.map((t) => [t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  )}`,
);
for (const [kind, n] of errorKinds) console.log(`- ${n} × ${kind}`);
const svg = await failoverChart(series);
const svgPath = await writeResultFile("failover.svg", svg);
const path = await writeResult("failover", {
  command,
  settings: {
    phaseSeconds: PHASE_S,
    freezeSeconds: FREEZE_S,
    concurrency: CONCURRENCY,
    breakers: BREAKERS,
  },
  phases: rows,
  seconds: series.map(({ latencies, ...rest }) => ({ ...rest, requests: latencies.length })),
  targets,
  errors: Object.fromEntries(errorKinds),
});
console.log(`\nwrote ${path} and ${svgPath}`);
