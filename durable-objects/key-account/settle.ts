/**
 * Settling a request once: its open row closed with its real usage (billed within the
 * budgets' room), an expired one settled late, a forgotten one billed from what the edge
 * held of it (docs/key-account.md, "Keys and settlement").
 */
import { type BudgetLine, billingCap } from "./budgets.ts";
import { HOUR_MS } from "../../contracts/budget-periods.ts";
import { KEY_SCOPE } from "./schema.ts";
import { deliveryNoted, expireRow, forgottenRow, rowMetrics, settleRow } from "./ledger.ts";
import { leasedRow } from "./leases/rows.ts";
import type { LedgerEntry } from "./schema.ts";
import { settledSample } from "./metrics.ts";
import type { AccountStore } from "./store.ts";
import { moneyUsed } from "./team/pool.ts";
import { type SettleInput, type SettleResult } from "./types.ts";
import { NO_BUDGETS } from "./budget-types.ts";

/** Settles one request, exactly once (repeats answer why nothing changed). */
export function settle(store: AccountStore, input: SettleInput, now: number): SettleResult {
  const { requestId } = input;
  const open = store.ledger.openRow(requestId);
  if (input.usageUnknown === true) return reconcileLater(store, open, input, now);
  if (open !== undefined) {
    // Exact, unless that would take a budget past its limit: the reservation was agreed at
    // admission, anything above it only while the budgets have room.
    const cap = teamCap(
      store,
      billingCap(linesAt(store, open), open.reservedPicos),
      open.reservedPicos,
    );
    return close(store, open, input, now, cap);
  }
  // Not in flight: settled or expired already, or its admission was forgotten by a crash
  // before it was written. Rare, so the committed row is read.
  const row = store.ledger.committed(requestId);
  if (row === null) {
    const leased = leasedRow(store, input, now);
    if (leased === null) return settleForgotten(store, input, now);
    const cap = teamCap(
      store,
      billingCap(linesAt(store, leased), leased.reservedPicos),
      leased.reservedPicos,
    );
    return close(store, leased, input, now, cap);
  }
  if (row.state === "settled") return { settled: false, requestId, reason: "already_settled" };
  if (row.state === "open") throw new Error(`open ledger row ${requestId} is not in memory`);
  // Expired: its reservation was released then, so it is billed only as far as budgets have
  // room; its usage is known now, so the origins need not be asked.
  store.ledger.resolve(requestId);
  return close(store, row, input, now, teamCap(store, billingCap(linesAt(store, row), 0n), 0n));
}

/**
 * How soon the origins are first asked about a request whose edge could not learn what it
 * generated: an origin too slow to answer the edge's ask has mostly caught up by then.
 */
export const RECONCILE_FIRST_ASK_MS = 1_000;

// A request whose edge could not learn what its origin generated: its reservation is
// released now, and the alarm asks the origins, first after `RECONCILE_FIRST_ASK_MS`, as
// for a lapsed lease (an expired row is asked about already). Any other is settled as
// usual, without usage.
function reconcileLater(
  store: AccountStore,
  open: LedgerEntry | undefined,
  input: SettleInput,
  now: number,
): SettleResult {
  const { requestId } = input;
  const leased = open === undefined ? unknownLeased(store, input, now) : null;
  const row = open ?? leased ?? undefined;
  if (row !== undefined) {
    store.apply(row, expireRow(row, now, input), now);
  } else {
    const expired = store.ledger.committed(requestId);
    if (expired?.state !== "expired") return settle(store, { ...input, usageUnknown: false }, now);
    // Its lease ran out first: the release still tells how it was delivered.
    store.apply(expired, deliveryNoted(expired, input), now);
  }
  store.ledger.lapse(requestId, now);
  return { settled: false, requestId, reason: "reconciling" };
}

// A leased request the ledger has no row of yet, opened to expire; null for any other.
function unknownLeased(store: AccountStore, input: SettleInput, now: number): LedgerEntry | null {
  if (store.ledger.committed(input.requestId) !== null) return null;
  return leasedRow(store, input, now);
}

// Settles a request whose admission a crash forgot, from what the edge held of it: a
// settled row with nothing reserved, in the day it settles. A request the edge does not
// say it admitted is unknown.
function settleForgotten(store: AccountStore, input: SettleInput, now: number): SettleResult {
  const entry = forgottenRow(
    input,
    { tags: store.key.record?.tags ?? [], teamId: store.key.record?.teamId ?? null },
    now,
  );
  if (entry === null)
    return { settled: false, requestId: input.requestId, reason: "unknown_request" };
  // As the admission agreed: its reservation in full, above it as far as the budgets have
  // room with that reservation counted, as it was before the crash.
  const admitted = input.admitted?.reservedPicos ?? 0n;
  const reserved = admitted > 0n ? admitted : 0n;
  const cap = teamCap(
    store,
    billingCap(withReserved(linesAt(store, entry), reserved), reserved),
    reserved,
  );
  return close(store, entry, input, now, cap);
}

// Settles an open, expired or forgotten row at most `capPicos` (null: no cap).
function close(
  store: AccountStore,
  row: LedgerEntry,
  input: SettleInput,
  now: number,
  capPicos: bigint | null,
): SettleResult {
  const { change, result } = settleRow(row, input, now, capPicos);
  store.apply(row, change, now);
  if (result.settled) {
    // Settled from the origins' records, it is counted as its edge said it was delivered.
    const told = {
      ...input,
      attempts: change.row.attempts,
      metrics: input.metrics ?? rowMetrics(change.row),
    };
    store.metrics.add(settledSample(told, change.row.model, result.costPicos, now));
  }
  return result;
}

/** Expires every open row whose lease ran out by `now` (settled late, should its END come). */
export function expireDue(store: AccountStore, now: number): void {
  for (const row of store.ledger.expiring(now)) {
    store.apply(row, expireRow(row, now), now);
    store.ledger.lapse(row.requestId, now);
  }
}

// A cost above the reservation is billed only as far as the key's lease of its team's money
// has room too (docs/key-account.md, "Teams").
function teamCap(store: AccountStore, cap: bigint | null, reservedPicos: bigint): bigint | null {
  const pool = store.team.pool;
  if (pool === null || !pool.budgeted) return cap;
  const reserved = store.spend.lifetime().reservedPicos;
  const room = pool.picos - moneyUsed(pool, { reservedPicos: reserved, inFlight: 0 });
  const most = reservedPicos + (room > 0n ? room : 0n);
  return cap === null || most < cap ? most : cap;
}

// The key's budgets whose windows hold the row's hour: the spend its cost counts in.
function linesAt(store: AccountStore, row: LedgerEntry): BudgetLine[] {
  const budgets = store.key.record?.budgets ?? NO_BUDGETS;
  return store.spend.lines(budgets, row.hour * HOUR_MS, KEY_SCOPE);
}

// Budgets as they would be with `picos` more reserved in each window.
function withReserved(lines: readonly BudgetLine[], picos: bigint): BudgetLine[] {
  return lines.map((line) => ({
    ...line,
    spend: { ...line.spend, reservedPicos: line.spend.reservedPicos + picos },
  }));
}
