/**
 * The contract of the account's reads (docs/key-account.md): usage totals and rows, one
 * request's ledger record and the spend log's query.
 */
import type { CheckCredential, CredentialRefusal, RequestAttempt, SettleOutcome } from "./types.ts";
import type { BudgetStatus } from "./budget-types.ts";

/** Totals of one UTC day and model (or of a whole range when `day` and `model` are null). */
export interface UsageTotals {
  requests: number;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  /** In pico-dollars, exact. */
  costPicos: bigint;
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
  /** In pico-dollars, exact. */
  reservedPicos: bigint;
  costPicos: bigint;
  endUser: string | null;
  /** The key's tags and the request's own. */
  tags: string[];
  /** The key's team when it was admitted, or null. */
  teamId: string | null;
  attempts: RequestAttempt[];
  /** The HTTP status its client received, once settled with it; else null. */
  httpStatus: number | null;
  /** From the edge receiving it to its settlement; null until then. */
  durationMs: number | null;
  /** To its first streamed byte; null when not streamed. */
  ttftMs: number | null;
  /** Answered from the response cache: its tokens are those saved, its cost the hit price. */
  cacheHit: boolean;
}

/** Which rows a spend log page lists, newest first. */
export interface RequestLogQuery {
  limit: number;
  /** Rows created in [from, to) (epoch ms). */
  from: number;
  to: number;
  /** Only rows older than this one (the cursor), when given. */
  before?: { createdAt: number; requestId: string };
  user?: string;
  tag?: string;
  model?: string;
  /** Only rows admitted while the key was in this team. */
  teamId?: string;
  /** Only rows in this state (`open`: in flight). */
  status?: LedgerRecord["state"];
  /** Only rows that ended so. */
  outcome?: NonNullable<LedgerRecord["outcome"]>;
}

/** Totals of one tag over a range of days. */
export type TagUsageRow = UsageTotals & { tag: string };

/** What `usage` is asked: a range of UTC days, optionally one end user's or one tag's rows. */
export interface UsageQuery {
  from: string;
  to: string;
  user?: string;
  tag?: string;
  /** Only the rows admitted while the key was in this team. */
  teamId?: string;
  /** `tag`: totals per tag as well. */
  by?: "tag";
  /** Only for this key's own secret (the edge's `/v1/usage`). */
  credential?: CheckCredential;
}

/** The answer to `usage`: rows per day and model (and per tag when asked), or a refusal. */
export type UsageResult =
  | { ok: true; rows: UsageRow[]; tags?: TagUsageRow[]; budgets: BudgetStatus[] }
  | CredentialRefusal;

/** The answer to `record`: the request's ledger row (null when unknown), or a refusal. */
export type RecordResult = { ok: true; record: LedgerRecord | null } | CredentialRefusal;
