/**
 * The chaos trial's traffic (docs/benchmarks.md, "Chaos"): clients sending mixed requests
 * while one origin is killed and started again, a burst of streams arrives at once on a
 * key of its own, and the whole edge is killed and started again.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { type RunningStack, type SpawnedOrigin, simFlags, spawnOrigin } from "../scripts/stack.ts";
import { mulberry32 } from "../origin/faults.ts";
import { type ChaosOutcome, drawKind, sendChaos } from "./chaos-client.ts";
import { setOriginFaults } from "./lib.ts";

/** Faults every origin answers with during the trial. */
export const CHAOS_FAULTS = {
  errorRate: 0.2,
  errorStatuses: [500, 503, 429],
  hangRate: 0.02,
  dropAfterTokens: 6,
  dropRate: 0.2,
};

/** What the traffic needs: its size, its keys and the simulated engine's speed. */
export interface TrafficOptions {
  requests: number;
  concurrency: number;
  seed: number;
  timeScale: number;
  key: string;
  /** The burst's key and size (null: no burst). */
  burst: { key: string; size: number } | null;
  log: (line: string) => void;
}

/** One event of the trial, when it happened. */
export interface TimelineEvent {
  at_request: number;
  at_ms: number;
  event: string;
}

/** The faults' times (epoch ms; null when one did not happen). */
export interface FaultTimes {
  /** The origin killed, and when it was back (its memory of earlier items lost). */
  killedOrigin: string | null;
  originBackAt: number | null;
  edgeKilledAt: number | null;
  edgeBackAt: number | null;
}

/** What the clients saw, the key of each request, and when the faults came. */
export interface Traffic {
  outcomes: ChaosOutcome[];
  burstOutcomes: ChaosOutcome[];
  keyOf: Map<ChaosOutcome, string>;
  timeline: TimelineEvent[];
  faults: FaultTimes;
}

/** Sends the trial's requests through `stack` with its faults; answers what came of them. */
export async function runTraffic(stack: RunningStack, options: TrafficOptions): Promise<Traffic> {
  const { key, burst, log } = options;
  const timeline: TimelineEvent[] = [];
  const faults: FaultTimes = {
    killedOrigin: null,
    originBackAt: null,
    edgeKilledAt: null,
    edgeBackAt: null,
  };
  const keyOf = new Map<ChaosOutcome, string>();
  const burstOutcomes: ChaosOutcome[] = [];
  // The edge's crash waits for the burst to end, so that each fault is counted apart.
  const burstEnded = Promise.withResolvers<void>();
  if (burst === null) burstEnded.resolve();
  for (const { origin } of stack.origins) {
    await setOriginFaults(origin.url, stack.originAdminToken, CHAOS_FAULTS);
  }

  const random = mulberry32(options.seed);
  const started = Date.now();
  const outcomes: ChaosOutcome[] = [];
  let next = 0;
  const mark = (event: string) =>
    timeline.push({ at_request: next, at_ms: Date.now() - started, event });
  const at = (fraction: number) => Math.floor(options.requests * fraction);
  const killOrigin = async () => {
    // A crash of one origin process (SIGKILL), then the same origin on the same port.
    const victim = stack.origins[0];
    if (victim === undefined) return;
    const spawned = victim.origin as unknown as SpawnedOrigin;
    const port = new URL(spawned.url).port;
    mark(`kill origin ${victim.origin.originId}`);
    faults.killedOrigin = victim.origin.originId;
    spawned.child.kill("SIGKILL");
    await sleep(2_000);
    const again = await spawnOrigin([
      ...simFlags({ timeScale: options.timeScale }),
      "--origin-id",
      victim.origin.originId,
      "--region",
      victim.region,
      "--port",
      port,
      "--access-token",
      stack.originAccessToken,
      "--admin-token",
      stack.originAdminToken,
    ]);
    victim.origin = again;
    await setOriginFaults(again.url, stack.originAdminToken, CHAOS_FAULTS);
    faults.originBackAt = Date.now();
    mark(`origin ${victim.origin.originId} back`);
  };
  const sendBurst = async (size: number, burstKey: string) => {
    // Streams at once, beside the clients' traffic, as a spike of callers would.
    mark(`burst of ${size} streams`);
    try {
      const sent = await Promise.all(
        Array.from({ length: size }, (_, i) =>
          sendChaos(stack.edgeUrl, burstKey, "stream", random, options.requests + i),
        ),
      );
      for (const outcome of sent) keyOf.set(outcome, burstKey);
      outcomes.push(...sent);
      burstOutcomes.push(...sent);
      mark(`burst done: ${sent.filter((o) => o.complete).length} complete`);
    } finally {
      burstEnded.resolve();
    }
  };
  const killEdge = async () => {
    await burstEnded.promise;
    mark("kill the edge");
    faults.edgeKilledAt = Date.now();
    await stack.restartEdge({ crash: true });
    faults.edgeBackAt = Date.now();
    mark("edge back");
  };
  const events = new Map<number, () => Promise<void>>([
    [at(0.35), killOrigin],
    ...(burst === null ? [] : [[at(0.5), () => sendBurst(burst.size, burst.key)] as const]),
    [at(0.7), killEdge],
  ]);

  const pending = new Set<Promise<void>>();
  const client = async () => {
    let failures = 0;
    while (next < options.requests) {
      const index = next++;
      const event = events.get(index);
      if (event !== undefined) {
        log(`chaos: ${index} sent, the next fault begins`);
        const running = event();
        pending.add(running);
        void running.finally(() => pending.delete(running));
      }
      const kind = drawKind(random);
      const outcome = await sendChaos(stack.edgeUrl, key, kind, random, index);
      keyOf.set(outcome, key);
      outcomes.push(outcome);
      // As an SDK would: after a failed connection, back off (0.25 s, doubling to 2 s),
      // and after a 429, wait what its retry-after-ms says (at most 2 s).
      failures = outcome.connectionFailed ? failures + 1 : 0;
      const pause =
        failures > 0
          ? Math.min(2_000, 250 * 2 ** (failures - 1))
          : Math.min(2_000, outcome.retryAfterMs ?? 0);
      if (pause > 0) await sleep(pause);
      if (index % 250 === 0) log(`chaos: ${index} of ${options.requests} sent`);
    }
  };
  await Promise.all(Array.from({ length: options.concurrency }, client));
  await Promise.all(pending);
  return { outcomes, burstOutcomes, keyOf, timeline, faults };
}
