/**
 * KeyAccount: one Durable Object per API key (named by the key id) holding its record,
 * secrets, rate-limit buckets, budgets and ledger in SQLite; it answers `admit` and
 * `settle` for the request path in one call each, decides from memory and writes behind.
 * Storage, invariants and commit stamps: docs/key-account.md.
 */
import { applyMigrations } from "../migrations.ts";
import { lookupOutcomes, outcomeSources, reconcile } from "./reconcile.ts";
import { MAX_OUTCOME_IDS } from "../../contracts/protocol.ts";
import { DurableObject } from "cloudflare:workers";
import { adjust, fullBucket, type BucketState } from "./token-bucket.ts";
import { WriteBehind } from "../write-behind.ts";
import {
  NO_BUDGETS,
  billingCap,
  decideAdmission,
  hasBudgets,
  rateLimitNow,
  tokenCorrection,
  type AdmissionRefusal,
  type CandidateModel,
  type PeriodSpend,
  type ScopeBuckets,
  type ScopeUsage,
  type SpendState,
} from "./admission.ts";
import {
  FREE,
  billedMicros,
  utcDay,
  utcMonth,
  worstCaseMicros,
  type TokenUsage,
} from "../../contracts/pricing.ts";
import { constantTimeEqual } from "../../contracts/hashing.ts";
import type { CommitStamp } from "../../contracts/commit-stamp.ts";
import {
  KEY_ACCOUNT_MIGRATIONS,
  KEY_SCOPE,
  LEDGER_COLUMNS,
  NOT_CLOSED,
  type LedgerEntry,
  type LedgerRow,
  type RecordRow,
  type SecretRow,
  type StoredCandidate,
  type UsageDbRow,
  ledgerEntryOf,
  ledgerRecordOf,
  modelsColumn,
  priceOf,
  recordOf,
  storedCandidate,
} from "./schema.ts";
import {
  ACCOUNT_WRITE_DELAY_MS,
  RECONCILE_RETRY_MS,
  RECONCILE_WINDOW_MS,
  LEDGER_RETENTION_MS,
  RESERVATION_LEASE_MS,
  type AdmitAnswer,
  type AdmitInput,
  type AdmitResult,
  type CheckCredential,
  type KeyCheckResult,
  type KeyCreateInput,
  type KeyRecord,
  type KeyUpdateInput,
  type RecordResult,
  type SettleInput,
  type SettleManyResult,
  type SettleResult,
  type UsageResult,
  type UsageTotals,
} from "./types.ts";

// Spend rows of days and months this far back are no longer needed for any budget.
const SPEND_RETENTION_MS = 62 * 86_400_000;
// Pruning runs at most this often, so steady traffic does not turn into an alarm per request.
const PRUNE_INTERVAL_MS = 60_000;
// An end user's buckets untouched this long are full again (or their debt is forgiven).
const IDLE_BUCKET_MS = 10 * 60_000;

/** A scope's buckets as last decided; null is a full bucket (never used, or idle and pruned). */
type ScopeState = { requests: BucketState | null; tokens: BucketState | null };

/** Limits, counters and reservations of one API key. */
export class KeyAccount extends DurableObject<Env> {
  #record: KeyRecord | null = null;
  #secrets: SecretRow[] = [];
  #alarmAt: number | null = null;
  /** Requests whose lease lapsed unsettled, to look up on the origins: id → when it lapsed. */
  readonly #lapsed = new Map<string, number>();
  readonly #writes: WriteBehind;
  // This run of the object; a failed commit resets it (see the constructor), so a new run
  // starts with a new one and the edge sends again what it carried before.
  readonly #incarnation = crypto.randomUUID();
  // The open ledger rows by request id: every request in flight.
  readonly #open = new Map<string, LedgerEntry>();
  // Open rows per end-user subject of browser tokens, for their concurrency limit.
  readonly #openBySubject = new Map<string, number>();
  // No open row expires before this (exact after each scan, a lower bound after a settle).
  #nextExpiry = Number.POSITIVE_INFINITY;
  // Loaded from SQLite on first use: buckets by scope, spend by period, usage_daily rows by
  // day and model. Dropped after pruning (with nothing queued), so they stay small.
  readonly #buckets = new Map<string, ScopeState>();
  readonly #periods = new Map<string, PeriodSpend>();
  readonly #rollups = new Map<string, UsageTotals>();

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    // Memory ahead of storage for good would bill from state that is gone: start again.
    this.#writes = new WriteBehind(ctx.storage, ACCOUNT_WRITE_DELAY_MS, () =>
      ctx.abort("key account commit failed"),
    );
    void ctx.blockConcurrencyWhile(() => this.#migrate());
  }

  /** Creates the key; null when this object already holds one. */
  create(input: KeyCreateInput): KeyRecord | null {
    if (this.#record !== null) return null;
    const sql = this.ctx.storage.sql;
    this.ctx.storage.transactionSync(() => {
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
    this.#load();
    return this.#record;
  }

  /** The key record, or null when no key lives here. */
  get(now?: number): KeyRecord | null {
    return this.#view(now ?? Date.now());
  }

  /** Applies a partial change; null when no key lives here. */
  update(input: KeyUpdateInput): KeyRecord | null {
    const current = this.#record;
    if (current === null) return null;
    const limits = { ...current.limits, ...input.limits };
    const budgets = { ...current.budgets, ...input.budgets };
    this.ctx.storage.sql.exec(
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
    this.#load();
    return this.#view(input.now);
  }

  /** Revokes the key: its very next request is refused. Null when no key lives here. */
  revoke(now: number): KeyRecord | null {
    if (this.#record === null) return null;
    if (this.#record.status !== "revoked") {
      this.ctx.storage.sql.exec(
        "UPDATE key_record SET status = 'revoked', revoked_at = ?, updated_at = ?, version = version + 1",
        now,
        now,
      );
      this.#load();
    }
    return this.#view(now);
  }

  /**
   * Makes `secretHash` the current secret; the previous one stays valid for `graceMs`.
   * Null when no key lives here or the key is revoked.
   */
  rotate(input: { secretHash: string; graceMs: number; now: number }): KeyRecord | null {
    if (this.#record === null || this.#record.status === "revoked") return null;
    const sql = this.ctx.storage.sql;
    const { now } = input;
    this.ctx.storage.transactionSync(() => {
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
    this.#load();
    return this.#view(now);
  }

  /**
   * Checks a credential without admitting a request (nothing is reserved or counted):
   * an API key's hash, the key's status and expiry, and the browser origin if any.
   */
  check(input: {
    credential: CheckCredential;
    origin?: string | null;
    now?: number;
  }): KeyCheckResult {
    const now = input.now ?? Date.now();
    const record = this.#record;
    if (record === null) return { ok: false, code: "invalid_api_key", reason: "unknown" };
    const { credential } = input;
    const refused = this.#credentialRefusal(credential, now);
    if (refused !== null) return refused;
    if (record.status === "revoked")
      return { ok: false, code: "invalid_api_key", reason: "revoked" };
    if (record.expiresAt !== null && now >= record.expiresAt) {
      return { ok: false, code: "invalid_api_key", reason: "expired" };
    }
    const origin = input.origin ?? null;
    if (origin !== null && !record.allowedOrigins.includes(origin)) {
      return { ok: false, code: "origin_not_allowed", origin };
    }
    return { ok: true, record: this.#view(now) ?? record };
  }

  /**
   * Admits or refuses one request atomically: secret, status, origin, models, concurrency,
   * requests, tokens and budgets; on admission reserves a concurrency slot, the tokens and
   * the worst-case cost, and opens the request's ledger row. Decided from memory; its writes
   * (and those of the settlements it carries) are committed behind, in `commit.pending`.
   */
  async admit(input: AdmitInput): Promise<AdmitAnswer> {
    const now = Date.now();
    let settled = false;
    for (const settlement of input.settle ?? []) {
      settled = this.#settle(settlement, settlement.now ?? now).settled || settled;
    }
    const result = this.#decide(input);
    if (result.ok) await this.#ensureAlarm(result.leaseExpiresAt);
    if (settled) await this.#ensureAlarm(now + LEDGER_RETENTION_MS);
    return { ...result, commit: this.#stamp() };
  }

  /** Ends a request exactly once: frees its slot and corrects its tokens with real usage. */
  async settle(input: SettleInput): Promise<SettleResult> {
    const [result] = (await this.settleMany([input])).results;
    if (result === undefined) throw new Error("no settle result");
    return result;
  }

  /**
   * Settles several requests in one call, each exactly once (see {@link settle}), and
   * commits before answering (`commit.pending` is `commit.committed`).
   */
  async settleMany(inputs: SettleInput[]): Promise<SettleManyResult> {
    const now = Date.now();
    const results = inputs.map((input) => this.#settle(input, input.now ?? now));
    // A settlement sent on its own carries a bill and travels after the response: it is
    // durable before the edge takes it as applied.
    this.#writes.flush();
    const commit = this.#stamp();
    if (results.some((result) => result.settled)) {
      await this.#ensureAlarm(now + LEDGER_RETENTION_MS);
    }
    return { results, commit };
  }

  // Where this answer stands among the commits, taken as the call answers, after its last write.
  #stamp(): CommitStamp {
    const committed = this.#writes.commits;
    return {
      incarnation: this.#incarnation,
      committed,
      pending: this.#writes.size === 0 ? committed : committed + 1,
    };
  }

  /** Commits the writes memory holds ahead of SQLite now (for tests and direct reads). */
  flush(): void {
    this.#writes.flush();
  }

  /**
   * Usage rollups from `from` to `to` (UTC days, inclusive), by day and model; with `user`,
   * only that end user's requests, summed from the ledger (kept LEDGER_RETENTION_MS). With
   * a credential, only for that key's own secret (the edge's `/v1/usage`).
   */
  usage(input: {
    from: string;
    to: string;
    user?: string;
    credential?: CheckCredential;
  }): UsageResult {
    if (input.credential !== undefined) {
      const check = this.check({ credential: input.credential });
      if (!check.ok) return check;
    }
    this.#writes.flush();
    const sql = this.ctx.storage.sql;
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
    return { ok: true, rows };
  }

  /** One request's ledger record (null when unknown or pruned), for its own key's secret. */
  record(input: { requestId: string; credential?: CheckCredential }): RecordResult {
    if (input.credential !== undefined) {
      const check = this.check({ credential: input.credential });
      if (!check.ok) return check;
    }
    this.#writes.flush();
    const entry = this.#ledgerRow(input.requestId);
    return { ok: true, record: entry === null ? null : ledgerRecordOf(entry) };
  }

  /**
   * Extends the leases of requests still in flight (the edge renews each while its client
   * is served); answers how many were open. A lapsed lease releases its slot and reservation.
   */
  renew(input: { requestIds: string[]; leaseMs: number; now?: number }): number {
    const now = input.now ?? Date.now();
    const expiresAt = now + clampLease(input.leaseMs);
    let renewed = 0;
    for (const requestId of input.requestIds) {
      const row = this.#open.get(requestId);
      if (row === undefined) continue;
      renewed++;
      if (row.expiresAt >= expiresAt) continue;
      row.expiresAt = expiresAt;
      this.#putLedger(row);
    }
    return renewed;
  }

  /**
   * Releases reservations past their lease, settles the lapsed ones from what the origins
   * remember, and prunes old rows; safe to run twice.
   */
  override async alarm(): Promise<void> {
    this.#alarmAt = null;
    const now = Date.now();
    this.#expireDue(now);
    await this.#reconcileLapsed(now);
    this.#writes.flush();
    this.#prune(now);
    await this.#rescheduleAlarm(now);
  }

  // A request whose lease lapsed unsettled lost its edge (a restart): its origin may still
  // know how it ended. Found ones are settled late, as any expired row can be, once.
  async #reconcileLapsed(now: number): Promise<void> {
    for (const [requestId, lapsedAt] of this.#lapsed) {
      if (lapsedAt + RECONCILE_WINDOW_MS <= now) this.#lapsed.delete(requestId);
    }
    const ids = [...this.#lapsed.keys()].slice(0, MAX_OUTCOME_IDS);
    if (ids.length === 0) return;
    const sources = outcomeSources(this.env.WARMGATE_CONFIG);
    const { items, complete } = await lookupOutcomes(sources, ids, this.env.ORIGIN_TOKEN);
    for (const [requestId, found] of reconcile(ids, items)) {
      if (found.kind === "running" || (found.kind === "unknown" && !complete)) continue;
      this.#lapsed.delete(requestId);
      if (found.kind === "unknown") continue;
      // The edge never confirmed delivery: an answer the origin finished counts as cut.
      const outcome = found.outcome === "ok" ? "cancelled" : found.outcome;
      this.#settle({ requestId, outcome, usage: found.usage, originBegan: true }, Date.now());
    }
  }

  // --- admission -------------------------------------------------------------------

  // Synchronous from first read to last update: this is the atomic section.
  #decide(input: AdmitInput): AdmitResult {
    const now = input.now ?? Date.now();
    const record = this.#record;
    if (record === null) return { ok: false, code: "invalid_api_key", reason: "unknown" };
    const { credential } = input;
    const refused = this.#credentialRefusal(credential, now);
    if (refused !== null) return refused;
    // A repeated admit (the edge retried the call) must not reserve twice. Request ids are
    // the edge's random ids, never reused: a closed row is not looked for (and a ledger
    // write never reopens one).
    const existing = this.#open.get(input.requestId);
    if (existing !== undefined) {
      return {
        ok: true,
        models: existing.candidates.map(([model]) => model),
        reservedTokens: existing.reservedTokens,
        reservedMicros: existing.reservedMicros,
        rateLimit: rateLimitNow(record.limits, this.#scopeUsage(KEY_SCOPE, null), now),
        requestId: input.requestId,
        tier: record.tier,
        allowRegionOverride: record.allowRegionOverride,
        leaseExpiresAt: existing.expiresAt,
        budgeted: hasBudgets(record.budgets),
      };
    }

    this.#expireDue(now);
    const subject = credential.kind === "browser" ? credential.subject : null;
    const endUser =
      credential.kind === "browser"
        ? { subject: credential.subject, limits: credential.limits, models: credential.models }
        : null;
    const offered = [
      { model: input.model, maxTokens: input.maxTokens, price: input.price ?? FREE },
      ...(input.fallbacks ?? []),
    ];
    const candidates: CandidateModel[] = offered.map((candidate) => ({
      model: candidate.model,
      maxTokens: candidate.maxTokens,
      worstCaseMicros: worstCaseMicros(candidate.price, input.promptTokens, candidate.maxTokens),
    }));
    const day = utcDay(now);
    const outcome = decideAdmission({
      key: {
        status: record.status,
        expiresAt: record.expiresAt,
        models: record.models,
        allowedOrigins: record.allowedOrigins,
        limits: record.limits,
        budgets: record.budgets,
      },
      endUser,
      usage: {
        key: this.#scopeUsage(KEY_SCOPE, null),
        endUser: subject === null ? null : this.#scopeUsage(userScope(subject), subject),
      },
      spend: this.#spendOf(day),
      request: {
        candidates,
        promptTokens: input.promptTokens,
        origin: input.origin ?? null,
        now,
      },
    });
    const { decision, state } = outcome;
    if (!decision.ok) return decision;

    const stored: StoredCandidate[] = offered
      .filter((candidate) => decision.models.includes(candidate.model))
      .map(({ model, price }) => storedCandidate(model, price));
    const leaseExpiresAt = now + clampLease(input.leaseMs);
    this.#putBuckets(KEY_SCOPE, state.key);
    if (subject !== null && state.endUser !== null) {
      this.#putBuckets(userScope(subject), state.endUser);
    }
    this.#openRequest({
      requestId: input.requestId,
      state: "open",
      model: decision.models[0] ?? input.model,
      day,
      subject,
      subjectTpm: endUser?.limits.tpm ?? null,
      endUser: input.endUser ?? null,
      reservedTokens: decision.reservedTokens,
      reservedMicros: decision.reservedMicros,
      candidates: stored,
      createdAt: now,
      expiresAt: leaseExpiresAt,
      ...NOT_CLOSED,
    });
    this.#addSpend(day, { reservedMicros: decision.reservedMicros, settledMicros: 0 });
    return {
      ...decision,
      requestId: input.requestId,
      tier: record.tier,
      allowRegionOverride: record.allowRegionOverride,
      leaseExpiresAt,
      budgeted: hasBudgets(record.budgets),
    };
  }

  // A key must match a live secret; a browser token dies with the secret that was current
  // when it was minted, so a rotation's grace period ends the tokens minted before it.
  #credentialRefusal(
    credential: CheckCredential,
    now: number,
  ): Extract<AdmissionRefusal, { code: "invalid_api_key" }> | null {
    if (credential.kind === "key") {
      if (this.#secretMatches(credential.secretHash, now)) return null;
      return { ok: false, code: "invalid_api_key", reason: "bad_secret" };
    }
    // Tokens carry whole seconds: one minted in the second of a rotation counts as after it.
    const minted = credential.issuedAt + 999;
    let current: SecretRow | null = null;
    for (const secret of this.#secrets) {
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

  #secretMatches(secretHash: string, now: number): boolean {
    // Compare against every live secret, without stopping at the first match.
    let match = false;
    for (const secret of this.#secrets) {
      const live = secret.valid_until === null || secret.valid_until > now;
      match = constantTimeEqual(secret.secret_hash, secretHash) && live ? true : match;
    }
    return match;
  }

  #scopeUsage(scope: string, subject: string | null): ScopeUsage {
    const { requests, tokens } = this.#scope(scope);
    const inFlight = subject === null ? this.#open.size : (this.#openBySubject.get(subject) ?? 0);
    return { requests, tokens, inFlight };
  }

  // A scope's buckets, from SQLite the first time.
  #scope(scope: string): ScopeState {
    const cached = this.#buckets.get(scope);
    if (cached !== undefined) return cached;
    const state: ScopeState = { requests: null, tokens: null };
    for (const row of this.ctx.storage.sql.exec<{
      kind: string;
      level: number;
      updated_at: number;
    }>("SELECT kind, level, updated_at FROM buckets WHERE scope = ?", scope)) {
      const bucket = { level: row.level, updatedAt: row.updated_at };
      if (row.kind === "requests") state.requests = bucket;
      else state.tokens = bucket;
    }
    this.#buckets.set(scope, state);
    return state;
  }

  #putBuckets(scope: string, buckets: ScopeBuckets): void {
    this.#putBucket(scope, "requests", buckets.requests);
    this.#putBucket(scope, "tokens", buckets.tokens);
  }

  #putBucket(scope: string, kind: "requests" | "tokens", bucket: BucketState): void {
    this.#scope(scope)[kind] = bucket;
    this.#writes.set(`bucket:${kind}:${scope}`, () =>
      this.ctx.storage.sql.exec(
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

  #openRequest(entry: LedgerEntry): void {
    this.#trackOpen(entry);
    this.#putLedger(entry);
  }

  #trackOpen(entry: LedgerEntry): void {
    this.#open.set(entry.requestId, entry);
    if (entry.subject !== null) {
      this.#openBySubject.set(entry.subject, (this.#openBySubject.get(entry.subject) ?? 0) + 1);
    }
    this.#nextExpiry = Math.min(this.#nextExpiry, entry.expiresAt);
  }

  // Forgets an open row (a no-op for a row that is not in flight here).
  #untrackOpen(entry: LedgerEntry): void {
    if (!this.#open.delete(entry.requestId) || entry.subject === null) return;
    const left = (this.#openBySubject.get(entry.subject) ?? 1) - 1;
    if (left > 0) this.#openBySubject.set(entry.subject, left);
    else this.#openBySubject.delete(entry.subject);
  }

  // Queues the row's whole current state: an admit and its settlement within one write
  // window are one INSERT. A write only moves a row forward (open → settled | expired,
  // expired → settled), so a stale or repeated one cannot reopen or rebill a closed row.
  #putLedger(entry: LedgerEntry): void {
    this.#writes.set(`ledger:${entry.requestId}`, () =>
      this.ctx.storage.sql.exec(
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
  #ledgerRow(requestId: string): LedgerEntry | null {
    const row = this.ctx.storage.sql
      .exec<LedgerRow>(`SELECT ${LEDGER_COLUMNS} FROM ledger WHERE request_id = ?`, requestId)
      .toArray()[0];
    return row === undefined ? null : ledgerEntryOf(row);
  }

  // --- settlement ------------------------------------------------------------------

  #settle(input: SettleInput, now: number): SettleResult {
    const { requestId } = input;
    const budgets = this.#record?.budgets ?? NO_BUDGETS;
    const open = this.#open.get(requestId);
    if (open !== undefined) {
      // Exact, unless that would take a budget past its limit: the reservation was agreed at
      // admission, anything above it only while the budgets have room.
      const cap = billingCap(budgets, this.#spendOf(open.day), open.reservedMicros);
      return this.#close(open, input, now, cap);
    }
    // Not in flight: settled or expired already, or its admission was forgotten by a crash
    // before it was written. Rare, so the committed row is read.
    this.#writes.flush();
    const row = this.#ledgerRow(requestId);
    if (row === null) return this.#settleForgotten(input, now);
    if (row.state === "settled") return { settled: false, requestId, reason: "already_settled" };
    if (row.state === "open") throw new Error(`open ledger row ${requestId} is not in memory`);
    // Expired: its reservation was released then, so it is billed only as far as budgets have room.
    return this.#close(row, input, now, billingCap(budgets, this.#spendOf(row.day), 0));
  }

  // Settles a request whose admission a crash forgot, from what the edge held of it: a
  // settled row with nothing reserved, in the day it settles. A request the edge does not
  // say it admitted is unknown.
  #settleForgotten(input: SettleInput, now: number): SettleResult {
    const admitted = input.admitted ?? null;
    const first = admitted?.models[0];
    if (admitted === null || first === undefined) {
      return { settled: false, requestId: input.requestId, reason: "unknown_request" };
    }
    const day = utcDay(now);
    const entry: LedgerEntry = {
      requestId: input.requestId,
      state: "open",
      model: first.model,
      day,
      subject: null,
      subjectTpm: null,
      endUser: null,
      reservedTokens: 0,
      reservedMicros: 0,
      candidates: admitted.models.map(({ model, price }) => storedCandidate(model, price)),
      createdAt: now,
      expiresAt: now,
      ...NOT_CLOSED,
    };
    // As the admission agreed: its reservation in full, above it as far as the budgets have
    // room with that reservation counted, as it was before the crash.
    const reserved = Math.max(0, admitted.reservedMicros);
    const budgets = this.#record?.budgets ?? NO_BUDGETS;
    const cap = billingCap(budgets, withReserved(this.#spendOf(day), reserved), reserved);
    return this.#close(entry, input, now, cap);
  }

  // Settles an open, expired or forgotten row at most `capMicros` (null: no cap).
  #close(
    row: LedgerEntry,
    input: SettleInput,
    now: number,
    capMicros: number | null,
  ): SettleResult {
    const usage = input.usage ?? null;
    const usedTokens = usage === null ? null : usage.prompt_tokens + usage.completion_tokens;
    const delta = tokenCorrection(row.reservedTokens, usedTokens, input.originBegan ?? true);
    // The model that served it, if it was one of the request's candidates.
    const served =
      row.candidates.find(([model]) => model === input.model) ??
      row.candidates.find(([model]) => model === row.model);
    const model = served?.[0] ?? row.model;
    const tokens: TokenUsage | null =
      usage === null
        ? null
        : {
            promptTokens: usage.prompt_tokens,
            cachedTokens: usage.cached_tokens ?? 0,
            completionTokens: usage.completion_tokens,
          };
    const late = row.state === "expired";
    const cost = billedMicros(tokens, priceOf(served), capMicros);
    if (delta !== 0) {
      this.#adjustTokens(KEY_SCOPE, this.#record?.limits.tpm ?? 0, delta, now);
      if (row.subject !== null && row.subjectTpm !== null) {
        this.#adjustTokens(userScope(row.subject), row.subjectTpm, delta, now);
      }
    }
    this.#untrackOpen(row);
    this.#putLedger({
      ...row,
      state: "settled",
      closedAt: now,
      outcome: input.outcome,
      model,
      promptTokens: usage?.prompt_tokens ?? null,
      cachedTokens: usage === null ? null : (usage.cached_tokens ?? 0),
      completionTokens: usage?.completion_tokens ?? null,
      costMicros: cost,
    });
    // An expired row released its reservation and was counted when it expired.
    this.#addSpend(row.day, {
      reservedMicros: late ? 0 : -row.reservedMicros,
      settledMicros: cost,
    });
    if (late && model !== row.model) this.#addUsage(row.day, row.model, -1, null, 0);
    this.#addUsage(row.day, model, late && model === row.model ? 0 : 1, tokens, cost);
    return {
      settled: true,
      requestId: row.requestId,
      reservedTokens: row.reservedTokens,
      usedTokens,
      costMicros: cost,
      late,
    };
  }

  #adjustTokens(scope: string, capacity: number, delta: number, now: number): void {
    // A missing bucket is full: a refund has nowhere to go, a charge starts from full.
    const current = this.#scope(scope).tokens ?? fullBucket(capacity, now);
    this.#putBucket(scope, "tokens", adjust(current, capacity, delta, now));
  }

  // --- expiry, pruning and the alarm -----------------------------------------------

  #expireDue(now: number): void {
    if (now < this.#nextExpiry) return;
    let next = Number.POSITIVE_INFINITY;
    // Deleting the entry being visited is safe while iterating a Map.
    for (const row of this.#open.values()) {
      if (row.expiresAt > now) {
        next = Math.min(next, row.expiresAt);
        continue;
      }
      this.#untrackOpen(row);
      this.#putLedger({
        ...row,
        state: "expired",
        closedAt: now,
        outcome: "expired",
        costMicros: 0,
      });
      this.#addSpend(row.day, { reservedMicros: -row.reservedMicros, settledMicros: 0 });
      this.#addUsage(row.day, row.model, 1, null, 0);
      this.#lapsed.set(row.requestId, now);
    }
    this.#nextExpiry = next;
  }

  // Deletes what is past its retention; the caller flushed, so SQLite holds all of memory.
  #prune(now: number): void {
    const sql = this.ctx.storage.sql;
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
    this.#loadSecrets();
    // What memory loaded on first use is loaded again from what is left.
    for (const scope of this.#buckets.keys()) {
      if (scope !== KEY_SCOPE) this.#buckets.delete(scope);
    }
    this.#periods.clear();
    this.#rollups.clear();
  }

  // --- spend and usage ------------------------------------------------------------

  #spendOf(day: string): SpendState {
    return {
      day: this.#period(`d:${day}`),
      month: this.#period(`m:${day.slice(0, 7)}`),
      lifetime: this.#period("all"),
    };
  }

  // A period's spend, from SQLite the first time.
  #period(period: string): PeriodSpend {
    const cached = this.#periods.get(period);
    if (cached !== undefined) return cached;
    const row = this.ctx.storage.sql
      .exec<{ settled_micros: number; reserved_micros: number }>(
        "SELECT settled_micros, reserved_micros FROM spend WHERE period = ?",
        period,
      )
      .toArray()[0];
    const spend = {
      settledMicros: row?.settled_micros ?? 0,
      reservedMicros: row?.reserved_micros ?? 0,
    };
    this.#periods.set(period, spend);
    return spend;
  }

  // Adds to the day's, its month's and the lifetime spend (negative releases).
  #addSpend(day: string, delta: PeriodSpend): void {
    if (delta.settledMicros === 0 && delta.reservedMicros === 0) return;
    for (const period of [`d:${day}`, `m:${day.slice(0, 7)}`, "all"]) {
      const current = this.#period(period);
      const next = {
        settledMicros: current.settledMicros + delta.settledMicros,
        reservedMicros: current.reservedMicros + delta.reservedMicros,
      };
      this.#periods.set(period, next);
      this.#writes.set(`spend:${period}`, () =>
        this.ctx.storage.sql.exec(
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

  #addUsage(
    day: string,
    model: string,
    requests: number,
    tokens: TokenUsage | null,
    costMicros: number,
  ): void {
    const key = `${day}\n${model}`;
    const current = this.#rollups.get(key) ?? this.#loadRollup(day, model);
    const next: UsageTotals = {
      requests: current.requests + requests,
      promptTokens: current.promptTokens + (tokens?.promptTokens ?? 0),
      cachedTokens:
        current.cachedTokens +
        (tokens === null ? 0 : Math.min(tokens.cachedTokens, tokens.promptTokens)),
      completionTokens: current.completionTokens + (tokens?.completionTokens ?? 0),
      costMicros: current.costMicros + costMicros,
    };
    this.#rollups.set(key, next);
    this.#writes.set(`usage:${key}`, () =>
      this.ctx.storage.sql.exec(
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

  #loadRollup(day: string, model: string): UsageTotals {
    const row = this.ctx.storage.sql
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

  // Moves the alarm only earlier: a write, and steady admits' leases end after it.
  async #ensureAlarm(at: number): Promise<void> {
    if (this.#alarmAt !== null && this.#alarmAt <= at) return;
    this.#alarmAt = at;
    await this.ctx.storage.setAlarm(at);
  }

  async #rescheduleAlarm(now: number): Promise<void> {
    const sql = this.ctx.storage.sql;
    let open = Number.POSITIVE_INFINITY;
    for (const row of this.#open.values()) open = Math.min(open, row.expiresAt);
    this.#nextExpiry = open;
    const closed = sql
      .exec<{ at: number | null }>("SELECT MIN(closed_at) AS at FROM ledger WHERE state <> 'open'")
      .one().at;
    const users = sql
      .exec<{ at: number | null }>(
        "SELECT MIN(updated_at) AS at FROM buckets WHERE scope <> ?",
        KEY_SCOPE,
      )
      .one().at;
    const prune = [
      closed === null ? null : closed + LEDGER_RETENTION_MS,
      users === null ? null : users + IDLE_BUCKET_MS,
    ]
      .filter((at): at is number => at !== null)
      .map((at) => Math.max(at, now + PRUNE_INTERVAL_MS));
    const lapsed = this.#lapsed.size > 0 ? [now + RECONCILE_RETRY_MS] : [];
    const candidates = [...prune, ...lapsed, ...(Number.isFinite(open) ? [open] : [])];
    if (candidates.length === 0) {
      await this.ctx.storage.deleteAlarm();
      return;
    }
    await this.#ensureAlarm(Math.min(...candidates));
  }

  // --- loading -----------------------------------------------------------------------

  async #migrate(): Promise<void> {
    applyMigrations(this.ctx.storage, KEY_ACCOUNT_MIGRATIONS);
    this.#load();
    for (const row of this.ctx.storage.sql.exec<LedgerRow>(
      `SELECT ${LEDGER_COLUMNS} FROM ledger WHERE state = 'open'`,
    )) {
      this.#trackOpen(ledgerEntryOf(row));
    }
    for (const row of this.ctx.storage.sql.exec<{ request_id: string; closed_at: number }>(
      "SELECT request_id, closed_at FROM ledger WHERE state = 'expired' AND closed_at > ?",
      Date.now() - RECONCILE_WINDOW_MS,
    )) {
      this.#lapsed.set(row.request_id, row.closed_at);
    }
    this.#alarmAt = await this.ctx.storage.getAlarm();
  }

  #load(): void {
    const row = this.ctx.storage.sql.exec<RecordRow>("SELECT * FROM key_record").toArray()[0];
    this.#record = row === undefined ? null : recordOf(row);
    this.#loadSecrets();
  }

  #loadSecrets(): void {
    this.#secrets = this.ctx.storage.sql
      .exec<SecretRow>("SELECT secret_hash, created_at, valid_until FROM secrets")
      .toArray();
  }

  #view(now: number): KeyRecord | null {
    if (this.#record === null) return null;
    let previous: number | null = null;
    for (const secret of this.#secrets) {
      if (secret.valid_until !== null && secret.valid_until > now) {
        previous = Math.max(previous ?? 0, secret.valid_until);
      }
    }
    return { ...this.#record, previousSecretValidUntil: previous };
  }
}

// Spend as it would be with `micros` more reserved in each period.
function withReserved(spend: SpendState, micros: number): SpendState {
  const add = (period: PeriodSpend) => ({
    ...period,
    reservedMicros: period.reservedMicros + micros,
  });
  return { day: add(spend.day), month: add(spend.month), lifetime: add(spend.lifetime) };
}

function userScope(subject: string): string {
  return `u:${subject}`;
}

function clampLease(leaseMs: number | undefined): number {
  if (leaseMs === undefined || !Number.isFinite(leaseMs)) return RESERVATION_LEASE_MS;
  return Math.min(60 * 60_000, Math.max(1_000, Math.floor(leaseMs)));
}
