/**
 * What a key account holds: its record and secrets, its buckets, its open ledger rows and
 * the spend and usage rows it has touched, in memory ahead of SQLite, written behind
 * (docs/key-account.md, "Storage"). The class and its admission and settlement work
 * through it; nothing here decides.
 */
import { WriteBehind } from "../write-behind.ts";
import { utcDay, utcMonth, type TokenUsage } from "../../contracts/pricing.ts";
import { constantTimeEqual } from "../../contracts/hashing.ts";
import type { CommitStamp } from "../../contracts/commit-stamp.ts";
import type {
  AdmissionRefusal,
  PeriodSpend,
  ScopeBuckets,
  ScopeUsage,
  SpendState,
} from "./admission.ts";
import { adjust, fullBucket, type BucketState } from "./token-bucket.ts";
import {
  KEY_SCOPE,
  LEDGER_COLUMNS,
  type LedgerEntry,
  type LedgerRow,
  type RecordRow,
  type SecretRow,
  type UsageDbRow,
  ledgerEntryOf,
  modelsColumn,
  recordOf,
} from "./schema.ts";
import {
  ACCOUNT_WRITE_DELAY_MS,
  LEDGER_RETENTION_MS,
  RECONCILE_WINDOW_MS,
  type CheckCredential,
  type KeyCreateInput,
  type KeyRecord,
  type KeyUpdateInput,
  type UsageRow,
  type UsageTotals,
} from "./types.ts";

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

  constructor(storage: DurableObjectStorage, onCommitFailed: () => void) {
    this.storage = storage;
    this.writes = new WriteBehind(storage, ACCOUNT_WRITE_DELAY_MS, onCommitFailed);
  }

  /** Creates the key; null when this object already holds one. */
  createKey(input: KeyCreateInput): KeyRecord | null {
    if (this.record !== null) return null;
    const sql = this.storage.sql;
    this.storage.transactionSync(() => {
      sql.exec(
        `INSERT INTO key_record (singleton, id, name, status, rpm, tpm, concurrency, allowed_origins,
           models, tier, expires_at, created_at, updated_at, revoked_at, version,
           budget_day_micros, budget_month_micros, credit_micros, allow_region_override)
         VALUES (1, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 1, ?, ?, ?, ?)`,
        input.id,
        input.name,
        input.limits.rpm,
        input.limits.tpm,
        input.limits.concurrency,
        JSON.stringify(input.allowedOrigins),
        input.models === null ? null : JSON.stringify(input.models),
        input.tier,
        input.expiresAt,
        input.now,
        input.now,
        input.budgets?.dayMicros ?? null,
        input.budgets?.monthMicros ?? null,
        input.budgets?.creditMicros ?? null,
        input.allowRegionOverride === true ? 1 : 0,
      );
      sql.exec(
        "INSERT INTO secrets (secret_hash, created_at, valid_until) VALUES (?, ?, NULL)",
        input.secretHash,
        input.now,
      );
    });
    this.load();
    return this.record;
  }

  /** Applies a partial change; null when no key lives here. */
  updateKey(input: KeyUpdateInput): KeyRecord | null {
    const current = this.record;
    if (current === null) return null;
    const limits = { ...current.limits, ...input.limits };
    const budgets = { ...current.budgets, ...input.budgets };
    this.storage.sql.exec(
      `UPDATE key_record SET name = ?, rpm = ?, tpm = ?, concurrency = ?, allowed_origins = ?,
         models = ?, tier = ?, expires_at = ?, updated_at = ?, version = version + 1,
         budget_day_micros = ?, budget_month_micros = ?, credit_micros = ?,
         allow_region_override = ?`,
      input.name ?? current.name,
      limits.rpm,
      limits.tpm,
      limits.concurrency,
      JSON.stringify(input.allowedOrigins ?? current.allowedOrigins),
      modelsColumn(input.models === undefined ? current.models : input.models),
      input.tier ?? current.tier,
      input.expiresAt === undefined ? current.expiresAt : input.expiresAt,
      input.now,
      budgets.dayMicros,
      budgets.monthMicros,
      budgets.creditMicros,
      (input.allowRegionOverride ?? current.allowRegionOverride) ? 1 : 0,
    );
    this.load();
    return this.view(input.now);
  }

  /** Revokes the key: its very next request is refused. Null when no key lives here. */
  revokeKey(now: number): KeyRecord | null {
    if (this.record === null) return null;
    if (this.record.status !== "revoked") {
      this.storage.sql.exec(
        "UPDATE key_record SET status = 'revoked', revoked_at = ?, updated_at = ?, version = version + 1",
        now,
        now,
      );
      this.load();
    }
    return this.view(now);
  }

  /**
   * Makes `secretHash` the current secret; the previous one stays valid for `graceMs`.
   * Null when no key lives here or the key is revoked.
   */
  rotateSecret(input: { secretHash: string; graceMs: number; now: number }): KeyRecord | null {
    if (this.record === null || this.record.status === "revoked") return null;
    const sql = this.storage.sql;
    const { now } = input;
    this.storage.transactionSync(() => {
      sql.exec("DELETE FROM secrets WHERE valid_until IS NOT NULL AND valid_until <= ?", now);
      sql.exec(
        "UPDATE secrets SET valid_until = ? WHERE valid_until IS NULL",
        now + Math.max(0, input.graceMs),
      );
      sql.exec(
        "INSERT INTO secrets (secret_hash, created_at, valid_until) VALUES (?, ?, NULL)",
        input.secretHash,
        now,
      );
      sql.exec("UPDATE key_record SET updated_at = ?, version = version + 1", now);
    });
    this.load();
    return this.view(now);
  }

  /** Usage rows by day and model (`user`: that end user's, from the ledger); flushes first. */
  usageRows(from: string, to: string, user: string | undefined): UsageRow[] {
    const input = { from, to, user };
    this.writes.flush();
    const sql = this.storage.sql;
    const cursor =
      input.user === undefined
        ? sql.exec<UsageDbRow>(
            `SELECT day, model, requests, prompt_tokens, cached_tokens, completion_tokens,
               cost_micros
             FROM usage_daily WHERE day >= ? AND day <= ? ORDER BY day, model`,
            input.from,
            input.to,
          )
        : sql.exec<UsageDbRow>(
            `SELECT day, model, COUNT(*) AS requests,
               COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,
               COALESCE(SUM(cached_tokens), 0) AS cached_tokens,
               COALESCE(SUM(completion_tokens), 0) AS completion_tokens,
               COALESCE(SUM(cost_micros), 0) AS cost_micros
             FROM ledger WHERE day >= ? AND day <= ? AND end_user = ? AND state <> 'open'
             GROUP BY day, model ORDER BY day, model`,
            input.from,
            input.to,
            input.user,
          );
    const rows = cursor.toArray().map((row) => ({
      day: row.day,
      model: row.model,
      requests: row.requests,
      promptTokens: row.prompt_tokens,
      cachedTokens: row.cached_tokens,
      completionTokens: row.completion_tokens,
      costMicros: row.cost_micros,
    }));
    return rows;
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

  // A key must match a live secret; a browser token dies with the secret that was current
  // when it was minted, so a rotation's grace period ends the tokens minted before it.
  credentialRefusal(
    credential: CheckCredential,
    now: number,
  ): Extract<AdmissionRefusal, { code: "invalid_api_key" }> | null {
    if (credential.kind === "key") {
      if (this.secretMatches(credential.secretHash, now)) return null;
      return { ok: false, code: "invalid_api_key", reason: "bad_secret" };
    }
    // Tokens carry whole seconds: one minted in the second of a rotation counts as after it.
    const minted = credential.issuedAt + 999;
    let current: SecretRow | null = null;
    for (const secret of this.secrets) {
      if (
        secret.created_at <= minted &&
        (current === null || secret.created_at > current.created_at)
      ) {
        current = secret;
      }
    }
    if (current !== null && (current.valid_until === null || current.valid_until > now))
      return null;
    return { ok: false, code: "invalid_api_key", reason: "rotated" };
  }

  secretMatches(secretHash: string, now: number): boolean {
    // Compare against every live secret, without stopping at the first match.
    let match = false;
    for (const secret of this.secrets) {
      const live = secret.valid_until === null || secret.valid_until > now;
      match = constantTimeEqual(secret.secret_hash, secretHash) && live ? true : match;
    }
    return match;
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

  // --- the ledger ------------------------------------------------------------------

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
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (request_id) DO UPDATE SET state = excluded.state, model = excluded.model,
           closed_at = excluded.closed_at, outcome = excluded.outcome,
           prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens,
           completion_tokens = excluded.completion_tokens, cost_micros = excluded.cost_micros,
           expires_at = excluded.expires_at
         WHERE ledger.state = 'open' OR (ledger.state = 'expired' AND excluded.state = 'settled')`,
        entry.requestId,
        entry.state,
        entry.model,
        entry.day,
        entry.subject,
        entry.subjectTpm,
        entry.endUser,
        entry.reservedTokens,
        entry.reservedMicros,
        JSON.stringify(entry.candidates),
        entry.createdAt,
        entry.expiresAt,
        entry.closedAt,
        entry.outcome,
        entry.promptTokens,
        entry.cachedTokens,
        entry.completionTokens,
        entry.costMicros,
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

  // --- expiry, pruning and the alarm -----------------------------------------------

  expireDue(now: number): void {
    if (now < this.nextExpiry) return;
    let next = Number.POSITIVE_INFINITY;
    // Deleting the entry being visited is safe while iterating a Map.
    for (const row of this.open.values()) {
      if (row.expiresAt > now) {
        next = Math.min(next, row.expiresAt);
        continue;
      }
      this.untrackOpen(row);
      this.putLedger({
        ...row,
        state: "expired",
        closedAt: now,
        outcome: "expired",
        costMicros: 0,
      });
      this.addSpend(row.day, { reservedMicros: -row.reservedMicros, settledMicros: 0 });
      this.addUsage(row.day, row.model, 1, null, 0);
      this.lapsed.set(row.requestId, now);
    }
    this.nextExpiry = next;
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
    this.loadSecrets();
    // What memory loaded on first use is loaded again from what is left.
    for (const scope of this.buckets.keys()) {
      if (scope !== KEY_SCOPE) this.buckets.delete(scope);
    }
    this.periods.clear();
    this.rollups.clear();
  }

  // --- spend and usage ------------------------------------------------------------

  spendOf(day: string): SpendState {
    return {
      day: this.period(`d:${day}`),
      month: this.period(`m:${day.slice(0, 7)}`),
      lifetime: this.period("all"),
    };
  }

  // A period's spend, from SQLite the first time.
  period(period: string): PeriodSpend {
    const cached = this.periods.get(period);
    if (cached !== undefined) return cached;
    const row = this.storage.sql
      .exec<{ settled_micros: number; reserved_micros: number }>(
        "SELECT settled_micros, reserved_micros FROM spend WHERE period = ?",
        period,
      )
      .toArray()[0];
    const spend = {
      settledMicros: row?.settled_micros ?? 0,
      reservedMicros: row?.reserved_micros ?? 0,
    };
    this.periods.set(period, spend);
    return spend;
  }

  // Adds to the day's, its month's and the lifetime spend (negative releases).
  addSpend(day: string, delta: PeriodSpend): void {
    if (delta.settledMicros === 0 && delta.reservedMicros === 0) return;
    for (const period of [`d:${day}`, `m:${day.slice(0, 7)}`, "all"]) {
      const current = this.period(period);
      const next = {
        settledMicros: current.settledMicros + delta.settledMicros,
        reservedMicros: current.reservedMicros + delta.reservedMicros,
      };
      this.periods.set(period, next);
      this.writes.set(`spend:${period}`, () =>
        this.storage.sql.exec(
          `INSERT INTO spend (period, settled_micros, reserved_micros) VALUES (?, ?, ?)
           ON CONFLICT (period) DO UPDATE SET settled_micros = excluded.settled_micros,
             reserved_micros = excluded.reserved_micros`,
          period,
          next.settledMicros,
          next.reservedMicros,
        ),
      );
    }
  }

  addUsage(
    day: string,
    model: string,
    requests: number,
    tokens: TokenUsage | null,
    costMicros: number,
  ): void {
    const key = `${day}\n${model}`;
    const current = this.rollups.get(key) ?? this.loadRollup(day, model);
    const next: UsageTotals = {
      requests: current.requests + requests,
      promptTokens: current.promptTokens + (tokens?.promptTokens ?? 0),
      cachedTokens:
        current.cachedTokens +
        (tokens === null ? 0 : Math.min(tokens.cachedTokens, tokens.promptTokens)),
      completionTokens: current.completionTokens + (tokens?.completionTokens ?? 0),
      costMicros: current.costMicros + costMicros,
    };
    this.rollups.set(key, next);
    this.writes.set(`usage:${key}`, () =>
      this.storage.sql.exec(
        `INSERT INTO usage_daily (day, model, requests, prompt_tokens, cached_tokens,
           completion_tokens, cost_micros) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (day, model) DO UPDATE SET requests = excluded.requests,
           prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens,
           completion_tokens = excluded.completion_tokens, cost_micros = excluded.cost_micros`,
        day,
        model,
        next.requests,
        next.promptTokens,
        next.cachedTokens,
        next.completionTokens,
        next.costMicros,
      ),
    );
  }

  loadRollup(day: string, model: string): UsageTotals {
    const row = this.storage.sql
      .exec<UsageDbRow>(
        `SELECT day, model, requests, prompt_tokens, cached_tokens, completion_tokens, cost_micros
         FROM usage_daily WHERE day = ? AND model = ?`,
        day,
        model,
      )
      .toArray()[0];
    return {
      requests: row?.requests ?? 0,
      promptTokens: row?.prompt_tokens ?? 0,
      cachedTokens: row?.cached_tokens ?? 0,
      completionTokens: row?.completion_tokens ?? 0,
      costMicros: row?.cost_micros ?? 0,
    };
  }

  load(): void {
    const row = this.storage.sql.exec<RecordRow>("SELECT * FROM key_record").toArray()[0];
    this.record = row === undefined ? null : recordOf(row);
    this.loadSecrets();
  }

  loadSecrets(): void {
    this.secrets = this.storage.sql
      .exec<SecretRow>("SELECT secret_hash, created_at, valid_until FROM secrets")
      .toArray();
  }

  view(now: number): KeyRecord | null {
    if (this.record === null) return null;
    let previous: number | null = null;
    for (const secret of this.secrets) {
      if (secret.valid_until !== null && secret.valid_until > now) {
        previous = Math.max(previous ?? 0, secret.valid_until);
      }
    }
    return { ...this.record, previousSecretValidUntil: previous };
  }
}
