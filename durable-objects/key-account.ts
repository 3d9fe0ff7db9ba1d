// KeyAccount: one Durable Object per API key (named by the key id). It holds the
// key's record, secrets, rate-limit buckets, budgets and its ledger in SQLite, and
// answers `admit` and `settle` for the request path in one call each.
//
// Tables
//   schema_migrations  version INTEGER PK, applied_at. One row per applied migration.
//   key_record         The key, at most one row (singleton = 1); absent until `create`.
//                      Times are epoch ms; models NULL allows every model; budget_*_micros
//                      and credit_micros NULL mean no such budget.
//   secrets            secret_hash PK (SHA-256 hex of the whole key), valid_until.
//                      Exactly one row with valid_until NULL (the current secret) while
//                      the key exists; rotated-out secrets carry the end of their grace.
//   buckets            (scope, kind) PK → level, updated_at. scope 'key' is the key,
//                      'u:<subject>' one end user of browser tokens; kind 'requests' or
//                      'tokens'. A missing row is a full bucket.
//   ledger             One row per admitted request, request_id PK. state 'open' →
//                      'settled' | 'expired', exactly once (an 'expired' row may still take
//                      its real usage once, → 'settled'). day is the UTC day of admission;
//                      the request's cost counts in that day and its month. candidates is
//                      the JSON list [model, input, cached input, output price] of the
//                      models it may be served by, prices fixed at admission. model is the
//                      first candidate, then the one that served it. Open rows are the
//                      in-flight requests: concurrency is their count. Closed rows stay
//                      LEDGER_RETENTION_MS, then are pruned (the rollups keep their sums).
//   usage_daily        (day, model) PK → requests, prompt_tokens, cached_tokens,
//                      completion_tokens, cost_micros: the sums over the closed ledger rows
//                      of that day and model. Kept for good.
//   spend              period PK ('d:YYYY-MM-DD', 'm:YYYY-MM' or 'all') → settled_micros
//                      (Σ cost_micros of the period's closed rows) and reserved_micros
//                      (Σ reserved_micros of its open rows).
//
// Invariants
//   - `admit` reads, decides and writes without an await in between, so concurrent
//     calls are serialised by the input gate: no two decisions see the same counters.
//   - For every period with a budget, settled + reserved never exceeds the budget after an
//     admission: a request is refused rather than reserved past it, and settling charges at
//     most what was reserved. (Only a late settlement of an expired row, whose reservation
//     was already released, can go past it.)
//   - Every request is settled at most once: its cost is added to spend and usage_daily
//     exactly once, its reservation released exactly once (settle or expiry).
//   - Every token reserved is given back or charged exactly once (settle), or kept
//     when the reservation expires unsettled (its real cost is unknown).
//   - An alarm is set whenever an open reservation or a prunable row exists, no later
//     than the earliest open expiry; running it twice changes nothing.

import { applyMigrations } from "./migrations.ts";
import { DurableObject } from "cloudflare:workers";
import { adjust, type BucketState } from "./token-bucket.ts";
import {
  NO_BUDGETS,
  billingCap,
  decideAdmission,
  hasBudgets,
  rateLimitNow,
  tokenCorrection,
  type Admission,
  type AdmissionRefusal,
  type Budgets,
  type CandidateModel,
  type KeyStatus,
  type Limits,
  type PeriodSpend,
  type ScopeUsage,
  type SpendState,
} from "./admission.ts";
import {
  FREE,
  billedMicros,
  utcDay,
  utcMonth,
  worstCaseMicros,
  type ModelPrice,
  type TokenUsage,
} from "./pricing.ts";
import { constantTimeEqual } from "../functions/keys.ts";

/** Priority tiers, lowest first; the batcher maps them to lanes. */
export const KEY_TIERS = ["low", "standard", "high"] as const;

/** A key's priority tier. */
export type KeyTier = (typeof KEY_TIERS)[number];

/** How long a reservation may stay open before the alarm releases it. */
export const RESERVATION_LEASE_MS = 15 * 60_000;

/** How long a closed ledger row is kept (a repeated settle is recognised meanwhile). */
export const LEDGER_RETENTION_MS = 35 * 86_400_000;

// Spend rows of days and months this far back are no longer needed for any budget.
const SPEND_RETENTION_MS = 62 * 86_400_000;

// Pruning runs at most this often, so steady traffic does not turn into an alarm per request.
const PRUNE_INTERVAL_MS = 60_000;
// An end user's buckets untouched this long are full again (or their debt is forgiven).
const IDLE_BUCKET_MS = 10 * 60_000;

/** The key record as the KeyAccount holds it (times in epoch ms). */
export interface KeyRecord {
  id: string;
  name: string;
  status: KeyStatus;
  limits: Limits;
  /** Spending limits in micro-dollars. */
  budgets: Budgets;
  allowedOrigins: string[];
  models: string[] | null;
  tier: KeyTier;
  expiresAt: number | null;
  createdAt: number;
  updatedAt: number;
  revokedAt: number | null;
  /** End of the grace period of the previous secret after a rotation, if still running. */
  previousSecretValidUntil: number | null;
  /** Increases with every change, so copies of the record (the directory) keep the newest. */
  version: number;
}

/** What `create` needs: the record's fields and the hash of the first secret. */
export interface KeyCreateInput {
  id: string;
  name: string;
  secretHash: string;
  limits: Limits;
  /** Absent: no budgets. */
  budgets?: Budgets;
  allowedOrigins: string[];
  models: string[] | null;
  tier: KeyTier;
  expiresAt: number | null;
  now: number;
}

/** A partial change to a key; `models: null` allows every model, `expiresAt: null` removes expiry. */
export interface KeyUpdateInput {
  name?: string;
  limits?: Partial<Limits>;
  /** A budget set to null is removed. */
  budgets?: Partial<Budgets>;
  allowedOrigins?: string[];
  models?: string[] | null;
  tier?: KeyTier;
  expiresAt?: number | null;
  now: number;
}

/** How a request presents itself to `admit`: an API key's hash or a verified browser token's scope. */
export type AdmitCredential =
  | { kind: "key"; secretHash: string }
  | {
      kind: "browser";
      /** End user id, or a per-token subject when the token names no user. */
      subject: string;
      limits: Limits;
      models: string[] | null;
    };

/** A model a request may fall back to, with its price and token allowance. */
export interface AdmitFallback {
  model: string;
  maxTokens: number;
  price: ModelPrice;
}

/** One admission request from the edge. */
export interface AdmitInput {
  requestId: string;
  credential: AdmitCredential;
  /** The model to try first. */
  model: string;
  promptTokens: number;
  /** Tokens the completion may produce; reserved in full until settled. */
  maxTokens: number;
  /** Prices of `model` in micro-dollars per 1M tokens; absent: free. */
  price?: ModelPrice;
  /** Models to try after `model`, in order (the rest of an alias's list). */
  fallbacks?: AdmitFallback[];
  /** The OpenAI `user` field, recorded with the reservation. */
  endUser?: string | null;
  /** The browser `Origin` header, if any. */
  origin?: string | null;
  /** Decision time; omit to use this object's clock (one clock per key). */
  now?: number;
  /** How long the reservation may stay open before the alarm releases it. */
  leaseMs?: number;
  /**
   * Settlements of this key's earlier requests that the edge sends along (one call
   * instead of two); applied before the decision, whatever it is.
   */
  settle?: SettleInput[];
}

/** An admitted request: its tier, rate-limit headers and when its reservation lapses. */
export type AdmitOk = Admission & {
  requestId: string;
  tier: KeyTier;
  leaseExpiresAt: number;
  /**
   * Whether the key has a budget: then a cost above the reservation is billed only as far
   * as the budgets have room, which only the account knows when it settles.
   */
  budgeted: boolean;
};

/** The answer to `admit`. */
export type AdmitResult = AdmitOk | AdmissionRefusal;

/** How a request ended. */
export type SettleOutcome = "ok" | "error" | "cancelled" | "timeout";

/** Real token usage, as OpenAI reports it (`cached_tokens`: prompt tokens the prefix cache served). */
export interface SettleUsage {
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens?: number;
}

/**
 * One settlement from the edge. Its cost comes from the usage at the served model's
 * admitted price (at most the reserved cost); without usage it costs nothing and its
 * reserved tokens stay charged to the rate limit.
 */
export interface SettleInput {
  requestId: string;
  outcome: SettleOutcome;
  usage?: SettleUsage | null;
  /** The model that served the request, when it is not the one admitted (alias fallback). */
  model?: string | null;
  now?: number;
}

/** The answer to `settle`: applied once, or why nothing changed. */
export type SettleResult =
  | {
      settled: true;
      requestId: string;
      reservedTokens: number;
      usedTokens: number | null;
      /** The cost billed, in micro-dollars. */
      costMicros: number;
      late: boolean;
    }
  | { settled: false; requestId: string; reason: "already_settled" | "unknown_request" };

/** What `check` compares: an API key's hash, or a verified browser token (its key's state only). */
export type CheckCredential = { kind: "key"; secretHash: string } | { kind: "browser" };

/** Result of checking a credential without admitting a request (token minting, `/v1/models`). */
export type KeyCheckResult =
  | { ok: true; record: KeyRecord }
  | Extract<AdmissionRefusal, { code: "invalid_api_key" | "origin_not_allowed" }>;

/** A refusal of a credential. */
export type CredentialRefusal = Exclude<KeyCheckResult, { ok: true }>;

/** Totals of one UTC day and model (or of a whole range when `day` and `model` are null). */
export interface UsageTotals {
  requests: number;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  costMicros: number;
}

/** One row of the usage rollup. */
export type UsageRow = UsageTotals & { day: string; model: string };

/** One request's ledger record (times epoch ms). */
export interface LedgerRecord {
  requestId: string;
  /** The model that served it (or the first candidate while it runs). */
  model: string;
  state: "open" | "settled" | "expired";
  outcome: SettleOutcome | "expired" | null;
  day: string;
  createdAt: number;
  closedAt: number | null;
  promptTokens: number | null;
  cachedTokens: number | null;
  completionTokens: number | null;
  reservedMicros: number;
  costMicros: number;
  endUser: string | null;
}

/** The answer to `usage`: rollup rows, or why the credential was refused. */
export type UsageResult = { ok: true; rows: UsageRow[] } | CredentialRefusal;

/** The answer to `record`: the request's ledger row (null when unknown), or a refusal. */
export type RecordResult = { ok: true; record: LedgerRecord | null } | CredentialRefusal;

/** The schema migrations, in order (version n is entry n - 1). */
export const KEY_ACCOUNT_MIGRATIONS: readonly string[] = [
  `CREATE TABLE key_record (
     singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
     id TEXT NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL,
     rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, concurrency INTEGER NOT NULL,
     allowed_origins TEXT NOT NULL, models TEXT, tier TEXT NOT NULL, expires_at INTEGER,
     created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, revoked_at INTEGER,
     version INTEGER NOT NULL);
   CREATE TABLE secrets (
     secret_hash TEXT PRIMARY KEY, created_at INTEGER NOT NULL, valid_until INTEGER);
   CREATE TABLE buckets (
     scope TEXT NOT NULL, kind TEXT NOT NULL, level REAL NOT NULL, updated_at INTEGER NOT NULL,
     PRIMARY KEY (scope, kind));
   CREATE TABLE reservations (
     request_id TEXT PRIMARY KEY, state TEXT NOT NULL, model TEXT NOT NULL,
     subject TEXT, subject_tpm INTEGER, end_user TEXT,
     reserved_tokens INTEGER NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
     closed_at INTEGER, outcome TEXT, prompt_tokens INTEGER, completion_tokens INTEGER);
   CREATE INDEX reservations_open ON reservations (state, expires_at);
   CREATE INDEX reservations_subject ON reservations (state, subject);
   CREATE INDEX reservations_closed ON reservations (closed_at);`,
  // Budgets, costs, the ledger and its rollups. Reservations become ledger rows and
  // rows closed before this migration count in the rollups with their tokens, at no cost.
  `ALTER TABLE key_record ADD COLUMN budget_day_micros INTEGER;
   ALTER TABLE key_record ADD COLUMN budget_month_micros INTEGER;
   ALTER TABLE key_record ADD COLUMN credit_micros INTEGER;
   ALTER TABLE reservations RENAME TO ledger;
   ALTER TABLE ledger ADD COLUMN day TEXT NOT NULL DEFAULT '';
   ALTER TABLE ledger ADD COLUMN cached_tokens INTEGER;
   ALTER TABLE ledger ADD COLUMN reserved_micros INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE ledger ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE ledger ADD COLUMN candidates TEXT NOT NULL DEFAULT '[]';
   UPDATE ledger SET day = strftime('%Y-%m-%d', created_at / 1000, 'unixepoch'),
     cached_tokens = CASE WHEN prompt_tokens IS NULL THEN NULL ELSE 0 END;
   CREATE INDEX ledger_day ON ledger (day);
   CREATE TABLE usage_daily (
     day TEXT NOT NULL, model TEXT NOT NULL, requests INTEGER NOT NULL,
     prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
     completion_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
     PRIMARY KEY (day, model));
   INSERT INTO usage_daily (day, model, requests, prompt_tokens, cached_tokens,
       completion_tokens, cost_micros)
     SELECT day, model, COUNT(*), COALESCE(SUM(prompt_tokens), 0), 0,
       COALESCE(SUM(completion_tokens), 0), 0
     FROM ledger WHERE state <> 'open' GROUP BY day, model;
   CREATE TABLE spend (
     period TEXT PRIMARY KEY, settled_micros INTEGER NOT NULL, reserved_micros INTEGER NOT NULL);`,
];

const KEY_SCOPE = "key";

type RecordRow = {
  id: string;
  name: string;
  status: string;
  rpm: number;
  tpm: number;
  concurrency: number;
  allowed_origins: string;
  models: string | null;
  tier: string;
  expires_at: number | null;
  created_at: number;
  updated_at: number;
  revoked_at: number | null;
  version: number;
  budget_day_micros: number | null;
  budget_month_micros: number | null;
  credit_micros: number | null;
};

type SecretRow = { secret_hash: string; valid_until: number | null };

type LedgerRow = {
  state: string;
  model: string;
  day: string;
  subject: string | null;
  subject_tpm: number | null;
  reserved_tokens: number;
  reserved_micros: number;
  candidates: string;
};

/** A candidate as a ledger row stores it: model and its three prices. */
type StoredCandidate = [model: string, input: number, cachedInput: number, output: number];

type FullLedgerRow = {
  request_id: string;
  model: string;
  state: string;
  outcome: string | null;
  day: string;
  created_at: number;
  closed_at: number | null;
  prompt_tokens: number | null;
  cached_tokens: number | null;
  completion_tokens: number | null;
  reserved_micros: number;
  cost_micros: number;
  end_user: string | null;
};

type UsageDbRow = {
  day: string;
  model: string;
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  cost_micros: number;
};

/** Limits, counters and reservations of one API key. */
export class KeyAccount extends DurableObject<Env> {
  #record: KeyRecord | null = null;
  #secrets: SecretRow[] = [];
  #alarmAt: number | null = null;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
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
           budget_day_micros, budget_month_micros, credit_micros)
         VALUES (1, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 1, ?, ?, ?)`,
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
         budget_day_micros = ?, budget_month_micros = ?, credit_micros = ?`,
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
    if (credential.kind === "key" && !this.#secretMatches(credential.secretHash, now)) {
      return { ok: false, code: "invalid_api_key", reason: "bad_secret" };
    }
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
   * the worst-case cost, and opens the request's ledger row.
   */
  async admit(input: AdmitInput): Promise<AdmitResult> {
    const now = Date.now();
    let settled = false;
    for (const settlement of input.settle ?? []) {
      settled = this.#settle(settlement, settlement.now ?? now).settled || settled;
    }
    const result = this.#decide(input);
    if (result.ok) await this.#ensureAlarm(result.leaseExpiresAt);
    if (settled) await this.#ensureAlarm(now + LEDGER_RETENTION_MS);
    return result;
  }

  /** Ends a request exactly once: frees its slot and corrects its tokens with real usage. */
  async settle(input: SettleInput): Promise<SettleResult> {
    const [result] = await this.settleMany([input]);
    if (result === undefined) throw new Error("no settle result");
    return result;
  }

  /** Settles several requests in one call, each exactly once (see {@link settle}). */
  async settleMany(inputs: SettleInput[]): Promise<SettleResult[]> {
    const now = Date.now();
    const results = inputs.map((input) => this.#settle(input, input.now ?? now));
    if (results.some((result) => result.settled)) {
      await this.#ensureAlarm(now + LEDGER_RETENTION_MS);
    }
    return results;
  }

  /**
   * Usage rollups from `from` to `to` (UTC days, inclusive), by day and model. With a
   * credential, only for that key's own secret (the edge's `/v1/usage`).
   */
  usage(input: { from: string; to: string; credential?: CheckCredential }): UsageResult {
    if (input.credential !== undefined) {
      const check = this.check({ credential: input.credential });
      if (!check.ok) return check;
    }
    const rows = this.ctx.storage.sql
      .exec<UsageDbRow>(
        `SELECT day, model, requests, prompt_tokens, cached_tokens, completion_tokens, cost_micros
         FROM usage_daily WHERE day >= ? AND day <= ? ORDER BY day, model`,
        input.from,
        input.to,
      )
      .toArray()
      .map((row) => ({
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
    const row = this.ctx.storage.sql
      .exec<FullLedgerRow>(
        `SELECT request_id, model, state, outcome, day, created_at, closed_at, prompt_tokens,
           cached_tokens, completion_tokens, reserved_micros, cost_micros, end_user
         FROM ledger WHERE request_id = ?`,
        input.requestId,
      )
      .toArray()[0];
    return { ok: true, record: row === undefined ? null : ledgerRecordOf(row) };
  }

  /** Releases reservations past their lease and prunes old rows; safe to run twice. */
  override async alarm(): Promise<void> {
    this.#alarmAt = null;
    const now = Date.now();
    this.#expireDue(now);
    this.#prune(now);
    await this.#rescheduleAlarm(now);
  }

  // --- admission -------------------------------------------------------------------

  // Synchronous from first read to last write: this is the atomic section.
  #decide(input: AdmitInput): AdmitResult {
    const now = input.now ?? Date.now();
    const record = this.#record;
    if (record === null) return { ok: false, code: "invalid_api_key", reason: "unknown" };
    const { credential } = input;
    if (credential.kind === "key" && !this.#secretMatches(credential.secretHash, now)) {
      return { ok: false, code: "invalid_api_key", reason: "bad_secret" };
    }
    const sql = this.ctx.storage.sql;
    const existing = sql
      .exec<{
        state: string;
        expires_at: number;
        reserved_tokens: number;
        reserved_micros: number;
        candidates: string;
      }>(
        "SELECT state, expires_at, reserved_tokens, reserved_micros, candidates FROM ledger WHERE request_id = ?",
        input.requestId,
      )
      .toArray()[0];
    if (existing !== undefined) {
      // A repeated admit (the edge retried the call) must not reserve twice.
      if (existing.state !== "open") throw new Error("request id already settled");
      return {
        ok: true,
        models: parseCandidates(existing.candidates).map(([model]) => model),
        reservedTokens: existing.reserved_tokens,
        reservedMicros: existing.reserved_micros,
        rateLimit: rateLimitNow(record.limits, this.#usage(KEY_SCOPE, null), now),
        requestId: input.requestId,
        tier: record.tier,
        leaseExpiresAt: existing.expires_at,
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
        key: this.#usage(KEY_SCOPE, null),
        endUser: subject === null ? null : this.#usage(userScope(subject), subject),
      },
      spend: this.#spend(day),
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
      .map(({ model, price }) => [
        model,
        price.inputMicrosPerMtok,
        price.cachedInputMicrosPerMtok,
        price.outputMicrosPerMtok,
      ]);
    const leaseExpiresAt = now + clampLease(input.leaseMs);
    this.ctx.storage.transactionSync(() => {
      this.#writeBucket(KEY_SCOPE, "requests", state.key.requests);
      this.#writeBucket(KEY_SCOPE, "tokens", state.key.tokens);
      if (subject !== null && state.endUser !== null) {
        this.#writeBucket(userScope(subject), "requests", state.endUser.requests);
        this.#writeBucket(userScope(subject), "tokens", state.endUser.tokens);
      }
      sql.exec(
        `INSERT INTO ledger (request_id, state, model, day, subject, subject_tpm, end_user,
           reserved_tokens, reserved_micros, candidates, created_at, expires_at)
         VALUES (?, 'open', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        input.requestId,
        decision.models[0] ?? input.model,
        day,
        subject,
        endUser?.limits.tpm ?? null,
        input.endUser ?? null,
        decision.reservedTokens,
        decision.reservedMicros,
        JSON.stringify(stored),
        now,
        leaseExpiresAt,
      );
      this.#addSpend(day, { reservedMicros: decision.reservedMicros, settledMicros: 0 });
    });
    return {
      ...decision,
      requestId: input.requestId,
      tier: record.tier,
      leaseExpiresAt,
      budgeted: hasBudgets(record.budgets),
    };
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

  #usage(scope: string, subject: string | null): ScopeUsage {
    const sql = this.ctx.storage.sql;
    let requests: BucketState | null = null;
    let tokens: BucketState | null = null;
    for (const row of sql.exec<{ kind: string; level: number; updated_at: number }>(
      "SELECT kind, level, updated_at FROM buckets WHERE scope = ?",
      scope,
    )) {
      const state = { level: row.level, updatedAt: row.updated_at };
      if (row.kind === "requests") requests = state;
      else tokens = state;
    }
    const inFlight =
      subject === null
        ? sql.exec<{ n: number }>("SELECT COUNT(*) AS n FROM ledger WHERE state = 'open'").one().n
        : sql
            .exec<{ n: number }>(
              "SELECT COUNT(*) AS n FROM ledger WHERE state = 'open' AND subject = ?",
              subject,
            )
            .one().n;
    return { requests, tokens, inFlight };
  }

  #writeBucket(scope: string, kind: "requests" | "tokens", state: BucketState): void {
    this.ctx.storage.sql.exec(
      `INSERT INTO buckets (scope, kind, level, updated_at) VALUES (?, ?, ?, ?)
       ON CONFLICT (scope, kind) DO UPDATE SET level = excluded.level, updated_at = excluded.updated_at`,
      scope,
      kind,
      state.level,
      state.updatedAt,
    );
  }

  // --- settlement ------------------------------------------------------------------

  #settle(input: SettleInput, now: number): SettleResult {
    const sql = this.ctx.storage.sql;
    const { requestId } = input;
    const row = sql
      .exec<LedgerRow>(
        `SELECT state, model, day, subject, subject_tpm, reserved_tokens, reserved_micros, candidates
         FROM ledger WHERE request_id = ?`,
        requestId,
      )
      .toArray()[0];
    if (row === undefined) return { settled: false, requestId, reason: "unknown_request" };
    if (row.state === "settled") return { settled: false, requestId, reason: "already_settled" };

    const usage = input.usage ?? null;
    const usedTokens = usage === null ? null : usage.prompt_tokens + usage.completion_tokens;
    const delta = tokenCorrection(row.reserved_tokens, usedTokens);
    const candidates = parseCandidates(row.candidates);
    // The model that served it, if it was one of the request's candidates.
    const served =
      candidates.find(([model]) => model === input.model) ??
      candidates.find(([model]) => model === row.model);
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
    // Exact, unless that would take a budget past its limit: the reservation was agreed at
    // admission, anything above it only while the budgets have room (an expired row's
    // reservation was already released).
    const cap = billingCap(
      this.#record?.budgets ?? NO_BUDGETS,
      this.#spend(row.day),
      late ? 0 : row.reserved_micros,
    );
    const cost = billedMicros(tokens, priceOf(served), cap);
    this.ctx.storage.transactionSync(() => {
      if (delta !== 0) {
        this.#adjustTokens(KEY_SCOPE, this.#record?.limits.tpm ?? 0, delta, now);
        if (row.subject !== null && row.subject_tpm !== null) {
          this.#adjustTokens(userScope(row.subject), row.subject_tpm, delta, now);
        }
      }
      sql.exec(
        `UPDATE ledger SET state = 'settled', closed_at = ?, outcome = ?, model = ?,
           prompt_tokens = ?, cached_tokens = ?, completion_tokens = ?, cost_micros = ?
         WHERE request_id = ?`,
        now,
        input.outcome,
        model,
        usage?.prompt_tokens ?? null,
        usage === null ? null : (usage.cached_tokens ?? 0),
        usage?.completion_tokens ?? null,
        cost,
        requestId,
      );
      // An expired row released its reservation and was counted when it expired.
      this.#addSpend(row.day, {
        reservedMicros: late ? 0 : -row.reserved_micros,
        settledMicros: cost,
      });
      if (late && model !== row.model) this.#addUsage(row.day, row.model, -1, null, 0);
      this.#addUsage(row.day, model, late && model === row.model ? 0 : 1, tokens, cost);
    });
    return {
      settled: true,
      requestId,
      reservedTokens: row.reserved_tokens,
      usedTokens,
      costMicros: cost,
      late,
    };
  }

  #adjustTokens(scope: string, capacity: number, delta: number, now: number): void {
    const row = this.ctx.storage.sql
      .exec<{ level: number; updated_at: number }>(
        "SELECT level, updated_at FROM buckets WHERE scope = ? AND kind = 'tokens'",
        scope,
      )
      .toArray()[0];
    // A missing bucket is full: a refund has nowhere to go, a charge starts from full.
    const state =
      row === undefined
        ? { level: capacity, updatedAt: now }
        : { level: row.level, updatedAt: row.updated_at };
    this.#writeBucket(scope, "tokens", adjust(state, capacity, delta, now));
  }

  // --- expiry, pruning and the alarm -----------------------------------------------

  #expireDue(now: number): void {
    const sql = this.ctx.storage.sql;
    const due = sql
      .exec<{ request_id: string; model: string; day: string; reserved_micros: number }>(
        `SELECT request_id, model, day, reserved_micros FROM ledger
         WHERE state = 'open' AND expires_at <= ?`,
        now,
      )
      .toArray();
    if (due.length === 0) return;
    this.ctx.storage.transactionSync(() => {
      for (const row of due) {
        sql.exec(
          `UPDATE ledger SET state = 'expired', closed_at = ?, outcome = 'expired', cost_micros = 0
           WHERE request_id = ?`,
          now,
          row.request_id,
        );
        this.#addSpend(row.day, { reservedMicros: -row.reserved_micros, settledMicros: 0 });
        this.#addUsage(row.day, row.model, 1, null, 0);
      }
    });
  }

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
  }

  // --- spend and usage ------------------------------------------------------------

  #spend(day: string): SpendState {
    const month = day.slice(0, 7);
    const periods = new Map<string, PeriodSpend>();
    for (const row of this.ctx.storage.sql.exec<{
      period: string;
      settled_micros: number;
      reserved_micros: number;
    }>(
      "SELECT period, settled_micros, reserved_micros FROM spend WHERE period IN (?, ?, 'all')",
      `d:${day}`,
      `m:${month}`,
    )) {
      periods.set(row.period, {
        settledMicros: row.settled_micros,
        reservedMicros: row.reserved_micros,
      });
    }
    const none = { settledMicros: 0, reservedMicros: 0 };
    return {
      day: periods.get(`d:${day}`) ?? none,
      month: periods.get(`m:${month}`) ?? none,
      lifetime: periods.get("all") ?? none,
    };
  }

  // Adds to the day's, its month's and the lifetime spend (negative releases).
  #addSpend(day: string, delta: PeriodSpend): void {
    if (delta.settledMicros === 0 && delta.reservedMicros === 0) return;
    for (const period of [`d:${day}`, `m:${day.slice(0, 7)}`, "all"]) {
      this.ctx.storage.sql.exec(
        `INSERT INTO spend (period, settled_micros, reserved_micros) VALUES (?, ?, ?)
         ON CONFLICT (period) DO UPDATE SET settled_micros = settled_micros + excluded.settled_micros,
           reserved_micros = reserved_micros + excluded.reserved_micros`,
        period,
        delta.settledMicros,
        delta.reservedMicros,
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
    this.ctx.storage.sql.exec(
      `INSERT INTO usage_daily (day, model, requests, prompt_tokens, cached_tokens,
         completion_tokens, cost_micros) VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (day, model) DO UPDATE SET requests = requests + excluded.requests,
         prompt_tokens = prompt_tokens + excluded.prompt_tokens,
         cached_tokens = cached_tokens + excluded.cached_tokens,
         completion_tokens = completion_tokens + excluded.completion_tokens,
         cost_micros = cost_micros + excluded.cost_micros`,
      day,
      model,
      requests,
      tokens?.promptTokens ?? 0,
      tokens === null ? 0 : Math.min(tokens.cachedTokens, tokens.promptTokens),
      tokens?.completionTokens ?? 0,
      costMicros,
    );
  }

  async #ensureAlarm(at: number): Promise<void> {
    if (this.#alarmAt !== null && this.#alarmAt <= at) return;
    this.#alarmAt = at;
    await this.ctx.storage.setAlarm(at);
  }

  async #rescheduleAlarm(now: number): Promise<void> {
    const sql = this.ctx.storage.sql;
    const open = sql
      .exec<{ at: number | null }>("SELECT MIN(expires_at) AS at FROM ledger WHERE state = 'open'")
      .one().at;
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
    const candidates = [...prune, ...(open === null ? [] : [open])];
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
    this.#alarmAt = await this.ctx.storage.getAlarm();
  }

  #load(): void {
    const row = this.ctx.storage.sql.exec<RecordRow>("SELECT * FROM key_record").toArray()[0];
    this.#record = row === undefined ? null : recordOf(row);
    this.#loadSecrets();
  }

  #loadSecrets(): void {
    this.#secrets = this.ctx.storage.sql
      .exec<SecretRow>("SELECT secret_hash, valid_until FROM secrets")
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

function recordOf(row: RecordRow): KeyRecord {
  return {
    id: row.id,
    name: row.name,
    status: row.status === "revoked" ? "revoked" : "active",
    limits: { rpm: row.rpm, tpm: row.tpm, concurrency: row.concurrency },
    budgets: {
      dayMicros: row.budget_day_micros,
      monthMicros: row.budget_month_micros,
      creditMicros: row.credit_micros,
    },
    allowedOrigins: JSON.parse(row.allowed_origins) as string[],
    models: row.models === null ? null : (JSON.parse(row.models) as string[]),
    tier: KEY_TIERS.find((tier) => tier === row.tier) ?? "standard",
    expiresAt: row.expires_at,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    revokedAt: row.revoked_at,
    previousSecretValidUntil: null,
    version: row.version,
  };
}

function parseCandidates(text: string): StoredCandidate[] {
  return JSON.parse(text) as StoredCandidate[];
}

function priceOf(candidate: StoredCandidate | undefined): ModelPrice {
  if (candidate === undefined) return FREE;
  const [, input, cachedInput, output] = candidate;
  return {
    inputMicrosPerMtok: input,
    cachedInputMicrosPerMtok: cachedInput,
    outputMicrosPerMtok: output,
  };
}

const LEDGER_STATES = ["open", "settled", "expired"] as const;
const LEDGER_OUTCOMES = ["ok", "error", "cancelled", "timeout", "expired"] as const;

function ledgerRecordOf(row: FullLedgerRow): LedgerRecord {
  return {
    requestId: row.request_id,
    model: row.model,
    state: LEDGER_STATES.find((state) => state === row.state) ?? "open",
    outcome: LEDGER_OUTCOMES.find((outcome) => outcome === row.outcome) ?? null,
    day: row.day,
    createdAt: row.created_at,
    closedAt: row.closed_at,
    promptTokens: row.prompt_tokens,
    cachedTokens: row.cached_tokens,
    completionTokens: row.completion_tokens,
    reservedMicros: row.reserved_micros,
    costMicros: row.cost_micros,
    endUser: row.end_user,
  };
}

function modelsColumn(models: string[] | null): string | null {
  return models === null ? null : JSON.stringify(models);
}

function userScope(subject: string): string {
  return `u:${subject}`;
}

function clampLease(leaseMs: number | undefined): number {
  if (leaseMs === undefined || !Number.isFinite(leaseMs)) return RESERVATION_LEASE_MS;
  return Math.min(60 * 60_000, Math.max(1_000, Math.floor(leaseMs)));
}
