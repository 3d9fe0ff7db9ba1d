/**
 * The chaos trial (docs/benchmarks.md, "Chaos"): the local stack with real origin
 * processes answering errors, hanging and cutting streams, one origin killed and started
 * again, a burst of streams at once, then the whole edge killed and started again, all
 * under mixed traffic; afterwards every request is checked against its key's ledger. Used
 * by `npm run bench:chaos` and, bounded, by the end-to-end tests.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { costPicos } from "../contracts/pricing.ts";
import { modelPrice } from "../functions/pricing.ts";
import {
  DEV_KEY_LIMITS,
  type RunningStack,
  type SpawnedOrigin,
  createKey,
  simFlags,
  spawnOrigin,
  startStack,
} from "../scripts/stack.ts";
import { mulberry32 } from "../origin/faults.ts";
import {
  type ChaosCounts,
  type ChaosOutcome,
  countOutcomes,
  drawKind,
  sendChaos,
} from "./chaos-client.ts";
import { stopOnSignal } from "./lib.ts";

/** Options of a trial. */
export interface ChaosOptions {
  requests: number;
  concurrency: number;
  seed: number;
  /** Wait after the traffic before checking slots and reservations (ms). */
  settleWaitMs: number;
  /** Simulated engine speed (1 realistic). */
  timeScale: number;
  /**
   * Streams sent at once halfway through the requests, on a key of their own whose limits
   * allow them (default 0: no burst); counted with the rest, and apart in `burst`.
   */
  burst?: number;
  log?: (line: string) => void;
}

/** Counts of what happened, and the losses, which should all be 0. */
export interface ChaosReport {
  counts: ChaosCounts;
  /** The burst's streams alone (null without one). */
  burst: ChaosCounts | null;
  losses: {
    lost_bills: number;
    double_bills: number;
    reservations_left_open: number;
    slots_leaked_after_30s: number;
    silently_truncated_200s: number;
    /** Answers cut by something other than their client (an error event, a cut connection) recorded as `ok`. */
    cut_recorded_ok: number;
    "5xx_edge_errors": number;
    non_openai_error_bodies: number;
  };
  timeline: { at_request: number; at_ms: number; event: string }[];
  /** Up to five examples of each loss: what the client saw, and the ledger's record. */
  examples: Record<string, { seen: ChaosOutcome; record: LedgerRecord | null }[]>;
}

/** Faults every origin answers with during the trial. */
export const CHAOS_FAULTS = {
  errorRate: 0.2,
  errorStatuses: [500, 503, 429],
  hangRate: 0.02,
  dropAfterTokens: 6,
  dropRate: 0.2,
};

const KEY_CONCURRENCY = 64;

type LedgerRecord = {
  status: string;
  outcome: string | null;
  prompt_tokens: number | null;
  cached_tokens: number | null;
  completion_tokens: number | null;
  cost_usd: number;
};

async function setFaults(stack: RunningStack, url: string): Promise<void> {
  const res = await fetch(`${url}/admin/faults`, {
    method: "PUT",
    headers: {
      authorization: `Bearer ${stack.originAdminToken}`,
      "content-type": "application/json",
    },
    body: JSON.stringify(CHAOS_FAULTS),
  });
  if (res.status !== 200) throw new Error(`setting faults on ${url}: ${res.status}`);
  await res.arrayBuffer();
}

async function record(stack: RunningStack, key: string, id: string): Promise<LedgerRecord | null> {
  const res = await fetch(`${stack.edgeUrl}/v1/usage/requests/${id}`, {
    headers: { authorization: `Bearer ${key}` },
  });
  if (res.status === 404) {
    await res.arrayBuffer();
    return null;
  }
  if (res.status !== 200) throw new Error(`reading ${id}: ${res.status}`);
  return (await res.json()) as LedgerRecord;
}

// Holds `n` streams at once and counts the ones refused for concurrency: leaked slots.
async function leakedSlots(stack: RunningStack, key: string, n: number): Promise<number> {
  const aborts = Array.from({ length: n }, () => new AbortController());
  const statuses = await Promise.all(
    aborts.map(async (abort) => {
      const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "warmgate-sim-8b",
          messages: [{ role: "user", content: "Hold a slot." }],
          max_tokens: 2_000,
          ignore_eos: true,
          stream: true,
        }),
        signal: abort.signal,
      });
      const code =
        res.status === 429 ? ((await res.json()) as { error: { code: string } }).error.code : null;
      return { status: res.status, code, res };
    }),
  );
  for (const abort of aborts) abort.abort();
  return statuses.filter((s) => s.status === 429 && s.code === "rate_limit_exceeded").length;
}

/** Runs a trial and returns its report; the stack is stopped however it ends. */
export async function runChaos(options: ChaosOptions): Promise<ChaosReport> {
  const log = options.log ?? (() => {});
  const state = await mkdtemp(join(tmpdir(), "warmgate-chaos-"));
  const stack = await startStack({
    regions: [
      { id: "eu", continents: ["EU", "AF"], origins: 2 },
      { id: "us", continents: ["NA", "SA", "AS", "OC", "AN"], origins: 2 },
    ],
    sim: { timeScale: options.timeScale },
    originProcesses: true,
    runtime: "workerd",
    persistTo: state,
    limits: { first_byte_timeout_ms: 2_000, request_timeout_ms: 20_000, retry_budget: 3 },
  });
  const stopAll = async () => {
    await stack.stop();
    await rm(state, { recursive: true, force: true });
  };
  const unregister = stopOnSignal(stopAll);
  const timeline: ChaosReport["timeline"] = [];
  try {
    const config = JSON.parse(stack.config) as {
      models: { id: string; pricing?: Parameters<typeof modelPrice>[0] }[];
    };
    const price = modelPrice(config.models.find((m) => m.id === "warmgate-sim-8b")?.pricing);
    const key = await createKey(stack.edgeUrl, stack.adminToken, {
      name: "chaos",
      limits: { rpm: 1_000_000, tpm: 1_000_000_000, concurrency: KEY_CONCURRENCY },
    });
    const burstSize = options.burst ?? 0;
    const burstKey =
      burstSize > 0
        ? await createKey(stack.edgeUrl, stack.adminToken, {
            name: "chaos burst",
            limits: { ...DEV_KEY_LIMITS, concurrency: Math.max(burstSize, KEY_CONCURRENCY) },
          })
        : null;
    // The key each outcome was sent with, for its ledger record.
    const keyOf = new Map<ChaosOutcome, string>();
    const burstOutcomes: ChaosOutcome[] = [];
    // The edge's crash waits for the burst to end, so that each fault is counted apart.
    const burstEnded = Promise.withResolvers<void>();
    if (burstKey === null) burstEnded.resolve();
    for (const { origin } of stack.origins) await setFaults(stack, origin.url);

    const random = mulberry32(options.seed);
    const started = Date.now();
    const outcomes: ChaosOutcome[] = [];
    let next = 0;
    const at = (fraction: number) => Math.floor(options.requests * fraction);
    const events = new Map<number, () => Promise<void>>([
      [
        at(0.35),
        async () => {
          // A crash of one origin process (SIGKILL), then the same origin on the same port.
          const victim = stack.origins[0];
          if (victim === undefined) return;
          const spawned = victim.origin as unknown as SpawnedOrigin;
          const port = new URL(spawned.url).port;
          timeline.push({
            at_request: next,
            at_ms: Date.now() - started,
            event: `kill origin ${victim.origin.originId}`,
          });
          spawned.child.kill("SIGKILL");
          await new Promise((resolve) => setTimeout(resolve, 2_000));
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
          await setFaults(stack, again.url);
          timeline.push({
            at_request: next,
            at_ms: Date.now() - started,
            event: `origin ${victim.origin.originId} back`,
          });
        },
      ],
      ...(burstKey === null
        ? []
        : [
            [
              at(0.5),
              async () => {
                // Streams at once, beside the clients' traffic, as a spike of callers would.
                timeline.push({
                  at_request: next,
                  at_ms: Date.now() - started,
                  event: `burst of ${burstSize} streams`,
                });
                try {
                  const sent = await Promise.all(
                    Array.from({ length: burstSize }, (_, i) =>
                      sendChaos(stack.edgeUrl, burstKey, "stream", random, options.requests + i),
                    ),
                  );
                  for (const outcome of sent) keyOf.set(outcome, burstKey);
                  outcomes.push(...sent);
                  burstOutcomes.push(...sent);
                  timeline.push({
                    at_request: next,
                    at_ms: Date.now() - started,
                    event: `burst done: ${sent.filter((o) => o.complete).length} complete`,
                  });
                } finally {
                  burstEnded.resolve();
                }
              },
            ] as const,
          ]),
      [
        at(0.7),
        async () => {
          await burstEnded.promise;
          timeline.push({ at_request: next, at_ms: Date.now() - started, event: "kill the edge" });
          await stack.restartEdge({ crash: true });
          timeline.push({ at_request: next, at_ms: Date.now() - started, event: "edge back" });
        },
      ],
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
        outcomes.push(outcome);
        // As an SDK would: after a failed connection, back off (0.25 s, doubling to 2 s).
        // and after a 429, wait what its retry-after-ms says (at most 2 s).
        failures = outcome.connectionFailed ? failures + 1 : 0;
        const pause =
          failures > 0
            ? Math.min(2_000, 250 * 2 ** (failures - 1))
            : Math.min(2_000, outcome.retryAfterMs ?? 0);
        if (pause > 0) await new Promise((resolve) => setTimeout(resolve, pause));
        if (index % 250 === 0) log(`chaos: ${index} of ${options.requests} sent`);
      }
    };
    await Promise.all(Array.from({ length: options.concurrency }, client));
    await Promise.all(pending);
    log(`chaos: traffic done; waiting ${options.settleWaitMs} ms for leases and settlements`);
    await new Promise((resolve) => setTimeout(resolve, options.settleWaitMs));

    const losses: ChaosReport["losses"] = {
      lost_bills: 0,
      double_bills: 0,
      reservations_left_open: 0,
      slots_leaked_after_30s: 0,
      silently_truncated_200s: 0,
      cut_recorded_ok: 0,
      "5xx_edge_errors": 0,
      non_openai_error_bodies: 0,
    };
    const billed = new Set<ChaosOutcome>();
    const abortsRecordedOk = new Set<ChaosOutcome>();
    const examples: ChaosReport["examples"] = {};
    const example = (loss: string, seen: ChaosOutcome, found: LedgerRecord | null) => {
      const list = (examples[loss] ??= []);
      if (list.length < 5) list.push({ seen, record: found });
    };
    let recordsSeen = 0;
    for (const outcome of outcomes) {
      if (outcome.silentlyTruncated) losses.silently_truncated_200s++;
      if (outcome.badErrorBody) losses.non_openai_error_bodies++;
      if (outcome.status !== null && outcome.status >= 500) {
        const documented = ["origin_error", "origin_timeout", "no_healthy_origin"];
        if (outcome.code === null || !documented.includes(outcome.code)) {
          losses["5xx_edge_errors"]++;
          example("5xx_edge_errors", outcome, null);
        }
      }
      if (outcome.requestId === null) continue;
      const found = await record(stack, keyOf.get(outcome) ?? key, outcome.requestId);
      if (found !== null) recordsSeen++;
      if (found?.status === "open") losses.reservations_left_open++;
      if (!outcome.complete && outcome.status === 200 && found?.outcome === "ok") {
        // A client's own abort that reached the edge after it had written the whole answer
        // is delivered, as far as any server can tell; anything else is a loss.
        if (outcome.kind === "abort" && !outcome.connectionFailed && !outcome.errorEvent) {
          abortsRecordedOk.add(outcome);
        } else {
          losses.cut_recorded_ok++;
          example("cut_recorded_ok", outcome, found);
        }
      }
      if (!outcome.complete || outcome.usage === null) continue;
      const expected = costPicos(
        {
          promptTokens: outcome.usage.prompt_tokens,
          cachedTokens: outcome.usage.cached_tokens,
          completionTokens: outcome.usage.completion_tokens,
        },
        price,
      );
      // cost_usd is the double nearest an exact pico-dollar amount: for the cents a request
      // here costs, scaling it back recovers that amount.
      const cost = found === null ? 0n : BigInt(Math.round(found.cost_usd * 1e12));
      if (found === null || found.status !== "settled" || cost < expected) {
        losses.lost_bills++;
        example("lost_bills", outcome, found);
      } else if (cost > expected) {
        losses.double_bills++;
        example("double_bills", outcome, found);
      } else billed.add(outcome);
    }
    // Each request counts once in its key's rollups: more than were sent is a double count.
    for (const k of burstKey === null ? [key] : [key, burstKey]) {
      const usage = await fetch(`${stack.edgeUrl}/v1/usage`, {
        headers: { authorization: `Bearer ${k}` },
      }).then((r) => r.json() as Promise<{ total: { requests: number } }>);
      const sentWith = outcomes.filter((o) => (keyOf.get(o) ?? key) === k).length;
      losses.double_bills += Math.max(0, usage.total.requests - sentWith);
    }
    losses.slots_leaked_after_30s = await leakedSlots(stack, key, KEY_CONCURRENCY);
    log(`chaos: ${recordsSeen} ledger records read`);

    return {
      counts: countOutcomes(outcomes, billed, abortsRecordedOk),
      burst: burstKey === null ? null : countOutcomes(burstOutcomes, billed, abortsRecordedOk),
      losses,
      timeline,
      examples,
    };
  } finally {
    await stopAll();
    unregister();
  }
}
