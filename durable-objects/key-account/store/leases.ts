/**
 * The key's leases (table `leases`, docs/key-account.md, "Leased allowances"): each lease
 * an isolate holds, in memory ahead of SQLite, from its grant until the origins have been
 * asked about every request it may have admitted unsettled.
 */
import { LEASE_SEQ_DIGITS, leaseIdRange, seqDigits } from "../../../contracts/lease-ids.ts";
import type { LeaseScope } from "../../../contracts/lease-scopes.ts";
import type { WriteBehind } from "../../write-behind.ts";
import { HOUR_MS } from "../../../contracts/budget-periods.ts";
import { utcDay } from "../../../contracts/pricing.ts";
import { type StoredCandidate, picosColumns, storedPicos } from "../schema.ts";

/** How long an ended lease is kept: its unsettled requests are asked about meanwhile. */
export const LEASE_RECONCILE_MS = 10 * 60_000;

/** A lease as the account holds it. */
export interface LeaseEntry {
  leaseId: string;
  secretHash: string;
  /** The UTC hour (since the epoch) its money and its requests count in. */
  hour: number;
  /**
   * `open`: the isolate may admit under it; `closing`: released, waiting for settlements
   * under way; `ended`: its slots and money are back, its unsettled requests asked about.
   */
  state: "open" | "closing" | "ended";
  createdAt: number;
  /** When an open lease lapses, a closing one ends. */
  expiresAt: number;
  /** Cumulative grants (requests and tokens taken from the buckets, ids named). */
  requests: number;
  tokens: number;
  ids: number;
  /** Cumulative money granted; null when the key had no budget at its grant. */
  picos: bigint | null;
  /** Money still reserved for it in the budgets (granted, less settled and given back). */
  reservedPicos: bigint;
  /** Concurrency slots it holds. */
  slots: number;
  /** Request ids its isolate may have used: `ids`, or what it reported at its release. */
  idsUsed: number;
  /** The models its requests may name (by index), with prices fixed at its grant. */
  models: StoredCandidate[];
  /** When it ended, or null. */
  endedAt: number | null;
  /** Whose requests it admits: one end user's, or (null) the key's. */
  scope: LeaseScope | null;
}

type LeaseRow = {
  lease_id: string;
  secret_hash: string;
  hour: number;
  state: string;
  created_at: number;
  expires_at: number;
  requests: number;
  tokens: number;
  ids: number;
  budgeted: number;
  picos_micros: number;
  picos_picos: number;
  reserved_micros: number;
  reserved_picos: number;
  slots: number;
  ids_used: number;
  models: string;
  ended_at: number | null;
  scope: string | null;
};

/** The key's leases, memory ahead of SQLite. */
export class LeaseStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  readonly #leases = new Map<string, LeaseEntry>();

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** Loads every lease not yet pruned (at start). */
  load(): void {
    for (const row of this.#sql.exec<LeaseRow>("SELECT * FROM leases")) {
      this.#leases.set(row.lease_id, leaseOf(row));
    }
  }

  /** A lease by id. */
  get(leaseId: string): LeaseEntry | undefined {
    return this.#leases.get(leaseId);
  }

  /** Every lease kept. */
  all(): IterableIterator<LeaseEntry> {
    return this.#leases.values();
  }

  /**
   * Concurrency slots the open and closing leases hold: all of them (the key's), or those of
   * one browser token's end user (`subject`).
   */
  slots(subject: string | null = null): number {
    let slots = 0;
    for (const lease of this.#leases.values()) {
      if (lease.state === "ended") continue;
      if (subject === null || lease.scope?.subject?.id === subject) slots += lease.slots;
    }
    return slots;
  }

  /** When the next lease lapses or ends (infinity when none). */
  nextExpiry(): number {
    let next = Number.POSITIVE_INFINITY;
    for (const lease of this.#leases.values()) {
      if (lease.state !== "ended") next = Math.min(next, lease.expiresAt);
    }
    return next;
  }

  /** Stores a lease's current state (written behind). */
  put(lease: LeaseEntry): void {
    this.#leases.set(lease.leaseId, lease);
    this.#writes.set(`lease:${lease.leaseId}`, () =>
      this.#sql.exec(
        `INSERT OR REPLACE INTO leases (lease_id, secret_hash, day, hour, state, created_at,
           expires_at, requests, tokens, ids, budgeted, picos_micros, picos_picos, reserved_micros,
           reserved_picos, slots, ids_used, models, ended_at, scope)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        lease.leaseId,
        lease.secretHash,
        utcDay(lease.hour * HOUR_MS),
        lease.hour,
        lease.state,
        lease.createdAt,
        lease.expiresAt,
        lease.requests,
        lease.tokens,
        lease.ids,
        lease.picos === null ? 0 : 1,
        ...picosColumns(lease.picos ?? 0n),
        ...picosColumns(lease.reservedPicos),
        lease.slots,
        lease.idsUsed,
        JSON.stringify(lease.models),
        lease.endedAt,
        lease.scope === null ? null : JSON.stringify(lease.scope),
      ),
    );
  }

  /** The ids of a lease's requests that have a ledger row (a flush first). */
  rowIds(leaseId: string): Set<string> {
    this.#writes.flush();
    const [from, to] = leaseIdRange(leaseId);
    const ids = new Set<string>();
    for (const row of this.#sql.exec<{ request_id: string }>(
      "SELECT request_id FROM ledger WHERE request_id >= ? AND request_id < ?",
      from,
      to,
    )) {
      ids.add(row.request_id);
    }
    return ids;
  }

  /** How many of a lease's first `ids` requests have a ledger row (a flush first). */
  rowsOf(leaseId: string, ids: number): number {
    this.#writes.flush();
    const [from, to] = leaseIdRange(leaseId);
    return this.#sql
      .exec<{ n: number }>(
        `SELECT COUNT(*) AS n FROM ledger WHERE request_id >= ? AND request_id < ?
           AND substr(request_id, -${LEASE_SEQ_DIGITS}) < ?`,
        from,
        to,
        seqDigits(ids),
      )
      .one().n;
  }

  /** When the first ended lease can be pruned; null when none has ended. */
  prunableAt(): number | null {
    let first: number | null = null;
    for (const lease of this.#leases.values()) {
      if (lease.endedAt !== null && (first === null || lease.endedAt < first)) {
        first = lease.endedAt;
      }
    }
    return first === null ? null : first + LEASE_RECONCILE_MS;
  }

  /** Deletes the leases that ended before the reconcile window; the caller flushed. */
  prune(now: number): void {
    for (const lease of this.#leases.values()) {
      if (lease.endedAt !== null && lease.endedAt + LEASE_RECONCILE_MS <= now) {
        this.#leases.delete(lease.leaseId);
      }
    }
    this.#sql.exec("DELETE FROM leases WHERE ended_at <= ?", now - LEASE_RECONCILE_MS);
  }
}

function leaseOf(row: LeaseRow): LeaseEntry {
  return {
    leaseId: row.lease_id,
    secretHash: row.secret_hash,
    hour: row.hour,
    state: row.state === "open" ? "open" : row.state === "closing" ? "closing" : "ended",
    createdAt: row.created_at,
    expiresAt: row.expires_at,
    requests: row.requests,
    tokens: row.tokens,
    ids: row.ids,
    picos: row.budgeted === 1 ? storedPicos(row.picos_micros, row.picos_picos) : null,
    reservedPicos: storedPicos(row.reserved_micros, row.reserved_picos),
    slots: row.slots,
    idsUsed: row.ids_used,
    models: JSON.parse(row.models) as StoredCandidate[],
    endedAt: row.ended_at,
    scope: row.scope === null ? null : (JSON.parse(row.scope) as LeaseScope),
  };
}
