/**
 * The chaos trial (docs/benchmarks.md, "Chaos"): the local stack with real origin
 * processes answering errors, hanging and cutting streams, one origin killed and started
 * again, a burst of streams at once, then the whole edge killed and started again, all
 * under mixed traffic. Afterwards every request is matched to its ledger record and to
 * what its origins remember, before the edge's leases could have cleaned anything and
 * again after. Used by `npm run bench:chaos` and, bounded, by the end-to-end tests.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { FREE, type ModelPrice, utcDay } from "../contracts/pricing.ts";
import type { ItemRecord } from "../contracts/protocol/schema.ts";
import { loadConfig } from "../contracts/config/gateway.ts";
import { END_WAIT_MS, ORIGIN_ASK } from "../functions/delivery/generated.ts";
import { DEV_KEY_LIMITS, createKey, startStack } from "../scripts/stack.ts";
import type { ChaosOutcome } from "./chaos-client.ts";
import {
  type ChaosLosses,
  type LedgerEntry,
  type OutcomeRow,
  type RequestFacts,
  type RollupCheck,
  type UserRows,
  billsByOutcome,
  chaosLosses,
  errorsByCode,
  errorsPerSecond,
  generatedBy,
} from "./chaos-ledger.ts";
import {
  type DayRange,
  readOriginItems,
  readRecords,
  readUserRows,
  refusedSlots,
  usageTotals,
} from "./chaos-lookup.ts";
import { type TimelineEvent, type Traffic, runTraffic } from "./chaos-traffic.ts";
import { stopOnSignal } from "./lib.ts";

/** Options of a trial. */
export interface ChaosOptions {
  requests: number;
  concurrency: number;
  seed: number;
  /** Wait after the traffic before the first look at records and slots (ms). */
  earlyWaitMs?: number;
  /** Wait after the traffic before the last look, once leases have lapsed (ms). */
  settleWaitMs: number;
  /** Simulated engine speed (1 realistic). */
  timeScale: number;
  /**
   * Streams sent at once halfway through the requests, on a key of their own whose limits
   * allow them (default 0: no burst); counted with the rest, and apart in `burstBills`.
   */
  burst?: number;
  log?: (line: string) => void;
}

/** What the trial counted: bills by outcome, errors by code, and the losses (all 0 wanted). */
export interface ChaosReport {
  bills: OutcomeRow[];
  /** The burst's streams alone (null without one). */
  burstBills: OutcomeRow[] | null;
  errors: ReturnType<typeof errorsByCode>;
  /** The burst's streams' errors alone (null without one). */
  burstErrors: ReturnType<typeof errorsByCode> | null;
  /** 5xx answers by code, per second from the first request sent (when the clients saw them). */
  errorsPerSecond: Record<string, number[]>;
  losses: ChaosLosses;
  /** Figures that are no loss by themselves. */
  reported: Record<string, number>;
  timeline: TimelineEvent[];
  /** Up to five examples of each loss: what the client saw, the records, the origins' items. */
  examples: Record<string, unknown[]>;
}

/** A lapsed lease frees a request's slot (functions/middleware/auth.ts, `LEASE_MS`). */
export const EDGE_LEASE_MS = 20_000;
// Time for a lapsed lease's alarm to run and its request to be looked up on the origins.
const LEASE_MARGIN_MS = 5_000;
/**
 * How long after its client's end the edge may still hold a request's settlement: the
 * queue's flush (20 ms) and the account's confirmation (its 50 ms write delay and a 100 ms
 * margin), with room for a loaded machine. A request that ended this close to the edge's
 * kill was in flight for its bill.
 */
const SETTLEMENT_HELD_MS = 1_000;
/**
 * How much longer the edge holds the bill of a stream whose client left: until its END
 * comes, or `END_WAIT_MS` and then its origin's record, asked a few times
 * (functions/delivery/generated.ts). Its slot was released at once, so the row reads
 * `expired` meanwhile; a crash then leaves it to the origins' records.
 */
const LEFT_STREAM_HELD_MS =
  END_WAIT_MS +
  (ORIGIN_ASK.tries ?? 1) * ((ORIGIN_ASK.timeoutMs ?? 0) + (ORIGIN_ASK.intervalMs ?? 0));
const KEY_CONCURRENCY = 64;
const PROBE_USER = "chaos-slot-probe";

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
  try {
    const config = loadConfig(stack.config);
    const prices = new Map(config.models.map((m) => [m.id, m.price]));
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
    const firstDay = utcDay(Date.now());
    const traffic = await runTraffic(stack, {
      ...options,
      key,
      burst: burstKey === null ? null : { key: burstKey, size: burstSize },
      log,
    });
    const { outcomes, faults } = traffic;
    const keys = burstKey === null ? [key] : [key, burstKey];
    const sentWith = (k: string) => outcomes.filter((o) => traffic.keyOf.get(o) === k);
    const readAll = async () => {
      const all = new Map<string, LedgerEntry | null>();
      for (const k of keys) {
        for (const [id, entry] of await readRecords(stack.edgeUrl, k, idsOf(sentWith(k)))) {
          all.set(id, entry);
        }
      }
      return all;
    };

    // The first look: before any lease that was live when the traffic ended could lapse,
    // yet after those of the requests the edge's crash cut (they hold slots by design).
    const trafficEnded = Date.now();
    const earlyAt = Math.max(
      trafficEnded + (options.earlyWaitMs ?? 5_000),
      (faults.edgeKilledAt ?? 0) + EDGE_LEASE_MS + LEASE_MARGIN_MS,
    );
    log(`chaos: traffic done; first look in ${earlyAt - Date.now()} ms`);
    await sleep(Math.max(0, earlyAt - Date.now()));
    const early = await readAll();
    const slotsRefusedBeforeLeases = await refusedSlots(
      stack.edgeUrl,
      key,
      KEY_CONCURRENCY,
      PROBE_USER,
    );
    const earlyDone = Date.now();

    // The last look: every lease live at the first has lapsed and been reconciled.
    const lateAt = Math.max(
      trafficEnded + options.settleWaitMs,
      earlyDone + EDGE_LEASE_MS + LEASE_MARGIN_MS,
    );
    log(`chaos: first look done; last look in ${lateAt - Date.now()} ms`);
    await sleep(Math.max(0, lateAt - Date.now()));
    const records = await readAll();
    const range: DayRange = { from: firstDay, to: utcDay(Date.now()) };
    const userRows = new Map<string, UserRows>();
    const rollups: RollupCheck[] = [];
    for (const k of keys) {
      const noId = sentWith(k).filter((o) => o.requestId === null);
      const users = [...noId.map((o) => o.user), ...(k === key ? [PROBE_USER] : [])];
      const rows = await readUserRows(stack.edgeUrl, k, range, users);
      for (const [user, found] of rows) userRows.set(user, found);
      rollups.push({
        rollup: await usageTotals(stack.edgeUrl, k, range),
        rows: closedRows([
          ...rows.values(),
          ...idsOf(sentWith(k)).map((id) => records.get(id) ?? null),
        ]),
      });
    }
    const items = await readOriginItems(
      stack.origins.map(({ origin }) => ({
        id: origin.originId,
        url: origin.url,
        token: stack.originAccessToken,
      })),
      idsOf(outcomes),
    );
    if (items === null) log("chaos: an origin did not answer; no bill can be checked");
    const slotsRefusedAfterLeases = await refusedSlots(
      stack.edgeUrl,
      key,
      KEY_CONCURRENCY,
      PROBE_USER,
    );
    log(`chaos: ${records.size} ledger records and ${userRows.size} end users read`);

    const price = (model: string | undefined): ModelPrice =>
      prices.get(model ?? "warmgate-sim-8b") ?? FREE;
    const factsOf = (seen: ChaosOutcome): RequestFacts => {
      const id = seen.requestId;
      const record = id === null ? undefined : (records.get(id) ?? null);
      const remembered = id === null || items === null ? null : (items.get(id) ?? []);
      const { edgeKilledAt, edgeBackAt, originBackAt, killedOrigin } = faults;
      return {
        seen,
        early: id === null ? undefined : (early.get(id) ?? null),
        record,
        userRows: id === null ? (userRows.get(seen.user) ?? null) : null,
        items: remembered,
        // Admitted before the killed origin came back, and tried there by its record (a
        // request through a Batcher lists no attempts: then remembered by no origin).
        originForgot:
          originBackAt !== null &&
          seen.sentAt < originBackAt &&
          record != null &&
          remembered !== null &&
          (record.origins.length === 0
            ? remembered.length === 0
            : record.origins.includes(killedOrigin) &&
              !remembered.some((i) => i.origin === killedOrigin)),
        // Its settlement dies with the edge until the account confirmed it, shortly after
        // its client's end (functions/accounts/settle-queue.ts).
        crashExposed:
          edgeKilledAt !== null &&
          seen.sentAt <= (edgeBackAt ?? Date.now()) &&
          seen.endedAt >=
            edgeKilledAt - SETTLEMENT_HELD_MS - (seen.clientAborted ? LEFT_STREAM_HELD_MS : 0),
        inCrashLeaseWindow:
          edgeKilledAt !== null &&
          seen.endedAt >= edgeKilledAt &&
          seen.sentAt <= edgeKilledAt + EDGE_LEASE_MS + LEASE_MARGIN_MS,
        price: price(record?.model),
      };
    };
    const facts = outcomes.map(factsOf);
    const { losses, examples } = chaosLosses(facts, {
      slotsRefusedBeforeLeases,
      slotsRefusedAfterLeases,
      rollups,
    });
    const burstSet = new Set(traffic.burstOutcomes);
    return {
      bills: billsByOutcome(facts),
      burstBills:
        burstKey === null ? null : billsByOutcome(facts.filter((f) => burstSet.has(f.seen))),
      errors: errorsByCode(outcomes),
      burstErrors: burstKey === null ? null : errorsByCode(traffic.burstOutcomes),
      errorsPerSecond: errorsPerSecond(outcomes),
      losses,
      reported: reportedFigures(facts, { trafficEnded, earlyAt, earlyDone, lateAt }, traffic),
      timeline: traffic.timeline,
      examples: Object.fromEntries(
        Object.entries(examples).map(([name, list]) => [name, list.map(exampleJson)]),
      ),
    };
  } finally {
    await stopAll();
    unregister();
  }
}

// The ids the clients saw.
const idsOf = (list: readonly ChaosOutcome[]) =>
  list.flatMap((o) => (o.requestId === null ? [] : [o.requestId]));

// Closed rows (settled or expired) add up as the rollups count them; open ones do not.
function closedRows(rows: readonly (UserRows | LedgerEntry | null)[]): UserRows {
  const sum: UserRows = { requests: 0, costPicos: 0n };
  for (const row of rows) {
    if (row === null) continue;
    if ("status" in row) {
      if (row.status === "open") continue;
      sum.requests++;
    } else sum.requests += row.requests;
    sum.costPicos += row.costPicos;
  }
  return sum;
}

function reportedFigures(
  facts: readonly RequestFacts[],
  times: { trafficEnded: number; earlyAt: number; earlyDone: number; lateAt: number },
  traffic: Traffic,
): Record<string, number> {
  const count = (test: (f: RequestFacts) => boolean) => facts.filter(test).length;
  const { edgeKilledAt } = traffic.faults;
  let abandoned = 0;
  for (const f of facts) {
    // Tokens generated by attempts other than the one billed (a retry's first try).
    const ended = (f.items ?? []).flatMap((i: ItemRecord) => (i.state === "ended" ? [i] : []));
    const all = ended.reduce((n, i) => n + (i.usage?.completion_tokens ?? 0), 0);
    abandoned += Math.max(0, all - (generatedBy(f)?.completionTokens ?? 0));
  }
  return {
    matched_by_id: count((f) => f.record !== undefined),
    matched_by_end_user_only: count((f) => f.record === undefined),
    no_ledger_row: count((f) => f.record === null || (f.userRows?.requests ?? 1) === 0),
    origin_forgot: count((f) => f.originForgot),
    in_flight_while_the_edge_was_down: count((f) => f.crashExposed),
    expired_at_first_look: count((f) => f.early?.status === "expired"),
    expired_at_last_look: count((f) => f.record?.status === "expired"),
    concurrency_refusals_while_crash_leases_held: count(
      (f) => f.seen.concurrencyRefusal && f.inCrashLeaseWindow,
    ),
    tokens_of_abandoned_attempts: abandoned,
    first_look_s_after_traffic: (times.earlyAt - times.trafficEnded) / 1000,
    first_look_s_after_edge_kill:
      edgeKilledAt === null ? Number.NaN : (times.earlyAt - edgeKilledAt) / 1000,
    last_look_s_after_first: (times.lateAt - times.earlyDone) / 1000,
  };
}

const entryJson = (e: LedgerEntry | null | undefined) =>
  e === undefined || e === null ? (e ?? null) : { ...e, costPicos: String(e.costPicos) };

function exampleJson(f: RequestFacts) {
  return {
    seen: f.seen,
    early: entryJson(f.early),
    record: entryJson(f.record),
    user_rows:
      f.userRows === null ? null : { ...f.userRows, costPicos: String(f.userRows.costPicos) },
    items: f.items,
    origin_forgot: f.originForgot,
    crash_exposed: f.crashExposed,
  };
}
