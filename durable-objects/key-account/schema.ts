/**
 * The key account's SQLite schema (docs/key-account.md, "Storage"): its migrations, the
 * rows as SQLite returns them, and the mappers between rows and what memory holds.
 */
import { FREE, type ModelPrice, PICOS_PER_MICRO } from "../../contracts/pricing.ts";
import { KEY_TIERS, type KeyRecord, type RequestAttempt } from "./types.ts";
import type { MetadataValue } from "../../contracts/tags.ts";
import { type LedgerRecord, type UsageRow } from "./usage-types.ts";

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
  `ALTER TABLE key_record ADD COLUMN allow_region_override INTEGER NOT NULL DEFAULT 0;`,
  `ALTER TABLE ledger ADD COLUMN attempts TEXT NOT NULL DEFAULT '[]';`,
  `CREATE TABLE metrics (name TEXT PRIMARY KEY, data TEXT NOT NULL);`,
  // Each secret's generation, which browser tokens name: a token ends with its secret.
  `ALTER TABLE secrets ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
   UPDATE secrets SET generation = rowid;`,
  // Amounts exact at any price: each amount's whole micro-dollars stay where they were, the
  // pico-dollars below one micro-dollar go beside them (see storedPicos); the metrics count
  // spend in pico-dollars.
  `ALTER TABLE ledger ADD COLUMN reserved_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE ledger ADD COLUMN cost_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE usage_daily ADD COLUMN cost_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE spend ADD COLUMN settled_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE spend ADD COLUMN reserved_picos INTEGER NOT NULL DEFAULT 0;
   UPDATE metrics SET data = json_remove(
       json_set(data, '$.spendPicos', json_extract(data, '$.spendMicros') * 1000000),
       '$.spendMicros')
     WHERE name <> 'errors';`,
  // Leased allowances: each isolate's lease, kept until its requests are all accounted for.
  `CREATE TABLE leases (
     lease_id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL, day TEXT NOT NULL, state TEXT NOT NULL,
     created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, requests INTEGER NOT NULL,
     tokens INTEGER NOT NULL, ids INTEGER NOT NULL, budgeted INTEGER NOT NULL,
     picos_micros INTEGER NOT NULL, picos_picos INTEGER NOT NULL, reserved_micros INTEGER NOT NULL,
     reserved_picos INTEGER NOT NULL, slots INTEGER NOT NULL, ids_used INTEGER NOT NULL,
     models TEXT NOT NULL, ended_at INTEGER);`,
  // Blocking: a key may be blocked and unblocked (status 'blocked'), unlike revoked.
  `ALTER TABLE key_record ADD COLUMN blocked_at INTEGER;`,
  // Tags and metadata on the key; each ledger row's tags (the key's and the request's).
  `ALTER TABLE key_record ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
   ALTER TABLE key_record ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
   ALTER TABLE ledger ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';`,
  // Spend logs: how the client saw each request, and rows listed newest first.
  `ALTER TABLE ledger ADD COLUMN http_status INTEGER;
   ALTER TABLE ledger ADD COLUMN duration_ms INTEGER;
   ALTER TABLE ledger ADD COLUMN ttft_ms INTEGER;
   CREATE INDEX ledger_created ON ledger (created_at, request_id);`,
  // Requests answered from the edge's response cache (docs/cache.md).
  `ALTER TABLE ledger ADD COLUMN cache_hit INTEGER NOT NULL DEFAULT 0;`,
  // Batch API holds: a batch's worst case reserved at creation, charged as its lines end.
  `CREATE TABLE batch_holds (
     batch_id TEXT PRIMARY KEY, day TEXT NOT NULL, reserved_picos TEXT NOT NULL,
     applied_seq INTEGER NOT NULL, created_at INTEGER NOT NULL);`,
  // Teams: the key's team, each row's, and the key's lease of its team's allowance.
  `ALTER TABLE key_record ADD COLUMN team_id TEXT;
   ALTER TABLE ledger ADD COLUMN team_id TEXT;
   CREATE TABLE team_pool (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), data TEXT NOT NULL);`,
];

/** The tags of a request's row: the key's, then the request's own not among them. */
export function rowTags(keyTags: readonly string[], requestTags: readonly string[] = []): string[] {
  return [...new Set([...keyTags, ...requestTags])];
}

/**
 * An amount as SQLite stores it: whole micro-dollars and the pico-dollars below them (or a
 * sum of each). SQLite's integers reach JavaScript as doubles, so one column of pico-dollars
 * would be exact only to $9,007; a pair is exact to $9e9.
 */
export function storedPicos(micros: number, picos: number): bigint {
  return BigInt(micros) * PICOS_PER_MICRO + BigInt(picos);
}

/** The two columns an amount is stored in: whole micro-dollars, then the pico-dollars left. */
export function picosColumns(amount: bigint): [micros: number, picos: number] {
  return [Number(amount / PICOS_PER_MICRO), Number(amount % PICOS_PER_MICRO)];
}

/** The `buckets` scope of the key itself (end users are `u:<subject>`). */
export const KEY_SCOPE = "key";

export type RecordRow = {
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
  allow_region_override: number;
  blocked_at: number | null;
  tags: string;
  metadata: string;
  team_id: string | null;
};

export type SecretRow = {
  secret_hash: string;
  generation: number;
  created_at: number;
  valid_until: number | null;
};

/** A candidate as a ledger row stores it: model and its three prices. */
export type StoredCandidate = [model: string, input: number, cachedInput: number, output: number];

/** A ledger row as the account holds it in memory and writes it. */
export interface LedgerEntry {
  requestId: string;
  state: LedgerRecord["state"];
  model: string;
  day: string;
  subject: string | null;
  subjectTpm: number | null;
  endUser: string | null;
  reservedTokens: number;
  reservedPicos: bigint;
  candidates: StoredCandidate[];
  createdAt: number;
  expiresAt: number;
  closedAt: number | null;
  outcome: LedgerRecord["outcome"];
  promptTokens: number | null;
  cachedTokens: number | null;
  completionTokens: number | null;
  costPicos: bigint;
  tags: string[];
  /** The key's team at admission, or null. */
  teamId: string | null;
  attempts: RequestAttempt[];
  httpStatus: number | null;
  durationMs: number | null;
  ttftMs: number | null;
  cacheHit: boolean;
}

/** The fields of a ledger entry that only its closing sets. */
export const NOT_CLOSED = {
  closedAt: null,
  outcome: null,
  promptTokens: null,
  cachedTokens: null,
  completionTokens: null,
  costPicos: 0n,
  attempts: [],
  httpStatus: null,
  durationMs: null,
  ttftMs: null,
  cacheHit: false,
} as const satisfies Partial<LedgerEntry>;

export const LEDGER_COLUMNS = `request_id, state, model, day, subject, subject_tpm, end_user,
  reserved_tokens, reserved_micros, reserved_picos, candidates, created_at, expires_at,
  closed_at, outcome, prompt_tokens, cached_tokens, completion_tokens, cost_micros, cost_picos,
  attempts, tags, http_status, duration_ms, ttft_ms, cache_hit, team_id`;

export type LedgerRow = {
  request_id: string;
  state: string;
  model: string;
  day: string;
  subject: string | null;
  subject_tpm: number | null;
  end_user: string | null;
  reserved_tokens: number;
  reserved_micros: number;
  reserved_picos: number;
  candidates: string;
  created_at: number;
  expires_at: number;
  closed_at: number | null;
  outcome: string | null;
  prompt_tokens: number | null;
  cached_tokens: number | null;
  completion_tokens: number | null;
  cost_micros: number;
  cost_picos: number;
  attempts: string;
  tags: string;
  http_status: number | null;
  duration_ms: number | null;
  ttft_ms: number | null;
  cache_hit: number;
  team_id: string | null;
};

export type UsageDbRow = {
  day: string;
  model: string;
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  cost_micros: number;
  cost_picos: number;
};

/** A usage row as answered, from its columns (or their sums). */
export function usageRowOf(row: UsageDbRow): UsageRow {
  return {
    day: row.day,
    model: row.model,
    requests: row.requests,
    promptTokens: row.prompt_tokens,
    cachedTokens: row.cached_tokens,
    completionTokens: row.completion_tokens,
    costPicos: storedPicos(row.cost_micros, row.cost_picos),
  };
}

export function recordOf(row: RecordRow): KeyRecord {
  return {
    id: row.id,
    name: row.name,
    status: row.status === "revoked" || row.status === "blocked" ? row.status : "active",
    limits: { rpm: row.rpm, tpm: row.tpm, concurrency: row.concurrency },
    budgets: {
      dayMicros: row.budget_day_micros,
      monthMicros: row.budget_month_micros,
      creditMicros: row.credit_micros,
    },
    allowedOrigins: JSON.parse(row.allowed_origins) as string[],
    models: row.models === null ? null : (JSON.parse(row.models) as string[]),
    tier: KEY_TIERS.find((tier) => tier === row.tier) ?? "standard",
    allowRegionOverride: row.allow_region_override === 1,
    expiresAt: row.expires_at,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    revokedAt: row.revoked_at,
    blockedAt: row.blocked_at,
    tags: JSON.parse(row.tags) as string[],
    metadata: JSON.parse(row.metadata) as Record<string, MetadataValue>,
    teamId: row.team_id,
    previousSecretValidUntil: null,
    version: row.version,
  };
}

export function storedCandidate(model: string, price: ModelPrice): StoredCandidate {
  return [
    model,
    price.inputMicrosPerMtok,
    price.cachedInputMicrosPerMtok,
    price.outputMicrosPerMtok,
  ];
}

export function priceOf(candidate: StoredCandidate | undefined): ModelPrice {
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

export function ledgerEntryOf(row: LedgerRow): LedgerEntry {
  return {
    requestId: row.request_id,
    state: LEDGER_STATES.find((state) => state === row.state) ?? "open",
    model: row.model,
    day: row.day,
    subject: row.subject,
    subjectTpm: row.subject_tpm,
    endUser: row.end_user,
    reservedTokens: row.reserved_tokens,
    reservedPicos: storedPicos(row.reserved_micros, row.reserved_picos),
    candidates: JSON.parse(row.candidates) as StoredCandidate[],
    createdAt: row.created_at,
    expiresAt: row.expires_at,
    closedAt: row.closed_at,
    outcome: LEDGER_OUTCOMES.find((outcome) => outcome === row.outcome) ?? null,
    promptTokens: row.prompt_tokens,
    cachedTokens: row.cached_tokens,
    completionTokens: row.completion_tokens,
    costPicos: storedPicos(row.cost_micros, row.cost_picos),
    attempts: JSON.parse(row.attempts) as RequestAttempt[],
    tags: JSON.parse(row.tags) as string[],
    teamId: row.team_id,
    httpStatus: row.http_status,
    durationMs: row.duration_ms,
    ttftMs: row.ttft_ms,
    cacheHit: row.cache_hit === 1,
  };
}

export function ledgerRecordOf(entry: LedgerEntry): LedgerRecord {
  return {
    requestId: entry.requestId,
    model: entry.model,
    state: entry.state,
    outcome: entry.outcome,
    day: entry.day,
    createdAt: entry.createdAt,
    closedAt: entry.closedAt,
    promptTokens: entry.promptTokens,
    cachedTokens: entry.cachedTokens,
    completionTokens: entry.completionTokens,
    reservedPicos: entry.reservedPicos,
    costPicos: entry.costPicos,
    endUser: entry.endUser,
    tags: entry.tags,
    teamId: entry.teamId,
    attempts: entry.attempts,
    httpStatus: entry.httpStatus,
    durationMs: entry.durationMs,
    ttftMs: entry.ttftMs,
    cacheHit: entry.cacheHit,
  };
}

export function modelsColumn(models: string[] | null): string | null {
  return models === null ? null : JSON.stringify(models);
}
