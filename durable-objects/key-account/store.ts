/**
 * What a key account holds: its record and secrets, its buckets, its open ledger rows and
 * the spend and usage rows it has touched, in memory ahead of SQLite, written behind
 * (docs/key-account.md, "Storage"). The class and its admission and settlement work
 * through it; nothing here decides.
 */
import { WriteBehind } from "../write-behind.ts";
import { utcDay, utcMonth } from "../../contracts/pricing.ts";
import type { CommitStamp } from "../../contracts/commit-stamp.ts";
import type { ScopeBuckets, ScopeUsage } from "./admission.ts";
import type { PeriodSpend } from "./budgets.ts";
import { adjust, fullBucket, type BucketState } from "./token-bucket.ts";
import { loadSecrets } from "./record.ts";
import type { MetricsState } from "./metrics.ts";
import {
  KEY_SCOPE,
  LEDGER_COLUMNS,
  type LedgerEntry,
  type LedgerRow,
  type SecretRow,
  ledgerEntryOf,
  picosColumns,
} from "./schema.ts";
import { ACCOUNT_WRITE_DELAY_MS, type KeyRecord, type UsageTotals } from "./types.ts";

/**
 * How long after its lease lapsed a request is still looked for on the origins (they
 * remember items for 15 minutes).
 */
export const RECONCILE_WINDOW_MS = 10 * 60_000;
/** How long a closed ledger row is kept (a repeated settle is recognised meanwhile). */
export const LEDGER_RETENTION_MS = 35 * 86_400_000;
// Spend rows of days and months this far back are no longer needed for any budget.
const SPEND_RETENTION_MS = 62 * 86_400_000;
// An end user's buckets untouched this long are full again (or their debt is forgiven).
export const IDLE_BUCKET_MS = 10 * 60_000;

/** A scope's buckets as last decided; null is a full bucket (never used, or idle and pruned). */
type ScopeState = { requests: BucketState | null; tokens: BucketState | null };

/** The bucket scope of one end user of browser tokens. */
export function userScope(subject: string): string {
  return `u:${subject}`;
}

/** One key account's state, memory ahead of SQLite. */
export class AccountStore {
  readonly storage: DurableObjectStorage;
  record: KeyRecord | null = null;
  secrets: SecretRow[] = [];
  /** Requests whose lease lapsed unsettled, to look up on the origins: id → when it lapsed. */
  readonly lapsed = new Map<string, number>();
  readonly writes: WriteBehind;
  // New with every start: an answer's stamp says which run its commits belong to.
  readonly incarnation = crypto.randomUUID();
  // Open ledger rows: every request in flight, loaded at start.
  readonly open = new Map<string, LedgerEntry>();
  // Open rows per end-user subject of browser tokens, for their concurrency limit.
  readonly openBySubject = new Map<string, number>();
  // No open row expires before this (exact after each scan, a lower bound after a settle).
  nextExpiry = Number.POSITIVE_INFINITY;
  // Loaded from SQLite on first use: buckets by scope, spend by period, usage_daily rows by
  // day and model. Dropped after pruning (with nothing queued), so they stay small.
  readonly buckets = new Map<string, ScopeState>();
  readonly periods = new Map<string, PeriodSpend>();
  readonly rollups = new Map<string, UsageTotals>();
  // The key's request metrics, loaded on first use (see metrics.ts).
  metrics: MetricsState | null = null;

  constructor(storage: DurableObjectStorage, onCommitFailed: () => void) {
    this.storage = storage;
    this.writes = new WriteBehind(storage, ACCOUNT_WRITE_DELAY_MS, onCommitFailed);
  }

  /** Loads the open rows, and the lapsed ones still to reconcile, at start. */
  loadLedger(now: number): void {
    for (const row of this.storage.sql.exec<LedgerRow>(
      `SELECT ${LEDGER_COLUMNS} FROM ledger WHERE state = 'open'`,
    )) {
      this.trackOpen(ledgerEntryOf(row));
    }
    for (const row of this.storage.sql.exec<{ request_id: string; closed_at: number }>(
      "SELECT request_id, closed_at FROM ledger WHERE state = 'expired' AND closed_at > ?",
      now - RECONCILE_WINDOW_MS,
    )) {
      this.lapsed.set(row.request_id, row.closed_at);
    }
  }

  // Where this answer stands among the commits, taken as the call answers, after its last write.
  stamp(): CommitStamp {
    const committed = this.writes.commits;
    return {
      incarnation: this.incarnation,
      committed,
      pending: this.writes.size === 0 ? committed : committed + 1,
    };
  }

  scopeUsage(scope: string, subject: string | null): ScopeUsage {
    const { requests, tokens } = this.scope(scope);
    const inFlight = subject === null ? this.open.size : (this.openBySubject.get(subject) ?? 0);
    return { requests, tokens, inFlight };
  }

  // A scope's buckets, from SQLite the first time.
  scope(scope: string): ScopeState {
    const cached = this.buckets.get(scope);
    if (cached !== undefined) return cached;
    const state: ScopeState = { requests: null, tokens: null };
    for (const row of this.storage.sql.exec<{
      kind: string;
      level: number;
      updated_at: number;
    }>("SELECT kind, level, updated_at FROM buckets WHERE scope = ?", scope)) {
      const bucket = { level: row.level, updatedAt: row.updated_at };
      if (row.kind === "requests") state.requests = bucket;
      else state.tokens = bucket;
    }
    this.buckets.set(scope, state);
    return state;
  }

  putBuckets(scope: string, buckets: ScopeBuckets): void {
    this.putBucket(scope, "requests", buckets.requests);
    this.putBucket(scope, "tokens", buckets.tokens);
  }

  putBucket(scope: string, kind: "requests" | "tokens", bucket: BucketState): void {
    this.scope(scope)[kind] = bucket;
    this.writes.set(`bucket:${kind}:${scope}`, () =>
      this.storage.sql.exec(
        `INSERT INTO buckets (scope, kind, level, updated_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (scope, kind) DO UPDATE SET level = excluded.level, updated_at = excluded.updated_at`,
        scope,
        kind,
        bucket.level,
        bucket.updatedAt,
      ),
    );
  }

  // --- spend and usage ------------------------------------------------------------

  openRequest(entry: LedgerEntry): void {
    this.trackOpen(entry);
    this.putLedger(entry);
  }

  trackOpen(entry: LedgerEntry): void {
    this.open.set(entry.requestId, entry);
    if (entry.subject !== null) {
      this.openBySubject.set(entry.subject, (this.openBySubject.get(entry.subject) ?? 0) + 1);
    }
    this.nextExpiry = Math.min(this.nextExpiry, entry.expiresAt);
  }

  // Forgets an open row (a no-op for a row that is not in flight here).
  untrackOpen(entry: LedgerEntry): void {
    if (!this.open.delete(entry.requestId) || entry.subject === null) return;
    const left = (this.openBySubject.get(entry.subject) ?? 1) - 1;
    if (left > 0) this.openBySubject.set(entry.subject, left);
    else this.openBySubject.delete(entry.subject);
  }

  // Queues the row's whole current state: an admit and its settlement within one write
  // window are one INSERT. A write only moves a row forward (open → settled | expired,
  // expired → settled), so a stale or repeated one cannot reopen or rebill a closed row.
  putLedger(entry: LedgerEntry): void {
    this.writes.set(`ledger:${entry.requestId}`, () =>
      this.storage.sql.exec(
        `INSERT INTO ledger (${LEDGER_COLUMNS})
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (request_id) DO UPDATE SET state = excluded.state, model = excluded.model,
           closed_at = excluded.closed_at, outcome = excluded.outcome,
           prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens,
           completion_tokens = excluded.completion_tokens, cost_micros = excluded.cost_micros,
           cost_picos = excluded.cost_picos, expires_at = excluded.expires_at, attempts = excluded.attempts
         WHERE ledger.state = 'open' OR (ledger.state = 'expired' AND excluded.state = 'settled')`,
        entry.requestId,
        entry.state,
        entry.model,
        entry.day,
        entry.subject,
        entry.subjectTpm,
        entry.endUser,
        entry.reservedTokens,
        ...picosColumns(entry.reservedPicos),
        JSON.stringify(entry.candidates),
        entry.createdAt,
        entry.expiresAt,
        entry.closedAt,
        entry.outcome,
        entry.promptTokens,
        entry.cachedTokens,
        entry.completionTokens,
        ...picosColumns(entry.costPicos),
        JSON.stringify(entry.attempts),
      ),
    );
  }

  // The committed row of a request; callers flush first.
  ledgerRow(requestId: string): LedgerEntry | null {
    const row = this.storage.sql
      .exec<LedgerRow>(`SELECT ${LEDGER_COLUMNS} FROM ledger WHERE request_id = ?`, requestId)
      .toArray()[0];
    return row === undefined ? null : ledgerEntryOf(row);
  }

  adjustTokens(scope: string, capacity: number, delta: number, now: number): void {
    // A missing bucket is full: a refund has nowhere to go, a charge starts from full.
    const current = this.scope(scope).tokens ?? fullBucket(capacity, now);
    this.putBucket(scope, "tokens", adjust(current, capacity, delta, now));
  }

  // Deletes what is past its retention; the caller flushed, so SQLite holds all of memory.
  prune(now: number): void {
    const sql = this.storage.sql;
    sql.exec(
      "DELETE FROM ledger WHERE state <> 'open' AND closed_at <= ?",
      now - LEDGER_RETENTION_MS,
    );
    sql.exec(
      "DELETE FROM buckets WHERE scope <> ? AND updated_at <= ?",
      KEY_SCOPE,
      now - IDLE_BUCKET_MS,
    );
    const old = now - SPEND_RETENTION_MS;
    sql.exec(
      "DELETE FROM spend WHERE (period LIKE 'd:%' AND period < ?) OR (period LIKE 'm:%' AND period < ?)",
      `d:${utcDay(old)}`,
      `m:${utcMonth(old)}`,
    );
    sql.exec("DELETE FROM secrets WHERE valid_until IS NOT NULL AND valid_until <= ?", now);
    loadSecrets(this);
    // What memory loaded on first use is loaded again from what is left.
    for (const scope of this.buckets.keys()) {
      if (scope !== KEY_SCOPE) this.buckets.delete(scope);
    }
    this.periods.clear();
    this.rollups.clear();
  }

  // --- spend and usage ------------------------------------------------------------
}
