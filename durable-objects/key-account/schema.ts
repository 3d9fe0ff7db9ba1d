/**
 * The key account's SQLite schema (docs/key-account.md, "Storage"): the rows as SQLite
 * returns them, and the mappers between rows and what memory holds (the migrations that
 * make the tables: migrations.ts).
 */
import { FREE, type ModelPrice, PICOS_PER_MICRO } from "../../contracts/pricing.ts";
import { KEY_TIERS, type KeyRecord, type RequestAttempt } from "./types.ts";
import { type ModelLimits } from "./budget-types.ts";
import type { PeriodBudget } from "./budget-types.ts";
import type { MetadataValue } from "../../contracts/tags.ts";
import { type LedgerRecord, type UsageRow } from "./usage-types.ts";

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
  budgets: string;
  credit_micros: number | null;
  model_limits: string;
  alert_webhook_url: string | null;
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
  /** The UTC hour (since the epoch) whose spend its reservation and cost count in. */
  hour: number;
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
  attempts, tags, http_status, duration_ms, ttft_ms, cache_hit, hour, team_id`;

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
  hour: number;
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
      periods: JSON.parse(row.budgets) as PeriodBudget[],
      creditMicros: row.credit_micros,
    },
    modelLimits: JSON.parse(row.model_limits) as Record<string, ModelLimits>,
    alertWebhookUrl: row.alert_webhook_url,
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
    hour: row.hour,
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
