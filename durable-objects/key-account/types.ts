/**
 * The contract of a key's `KeyAccount` (docs/key-account.md): what the edge sends to it and
 * what it answers, and the constants both sides use.
 */
import type { MetadataValue } from "../../contracts/tags.ts";
import type { CommitStamp } from "../../contracts/commit-stamp.ts";
import type { ModelPrice } from "../../contracts/pricing.ts";
import type { SettleCache, SettleMetrics } from "./settle-types.ts";
import type { BudgetName, Budgets, ModelLimits, PeriodBudget } from "./budget-types.ts";

/** Priority tiers, lowest first; the batcher maps them to lanes. */
export const KEY_TIERS = ["low", "standard", "high"] as const;

/** A key's priority tier. */
export type KeyTier = (typeof KEY_TIERS)[number];

/** How long a reservation may stay open before the alarm releases it, unless given. */
export const RESERVATION_LEASE_MS = 15 * 60_000;

/** Whether a key may be used: `blocked` refuses every request until unblocked; `revoked` is final. */
export type KeyStatus = "active" | "blocked" | "revoked";

/** Per-minute and in-flight limits, for a key or for one end user of a browser token. */
export interface Limits {
  rpm: number;
  tpm: number;
  concurrency: number;
}

/** Values for OpenAI's `x-ratelimit-*-requests` and `x-ratelimit-*-tokens` headers. */
export interface RateLimitInfo {
  requests: BucketSnapshot;
  tokens: BucketSnapshot;
}

/** Which limit refused a request. */
export type LimitName = "requests" | "tokens" | "concurrency";

/** Why a key or a browser token is not accepted. */
export type InvalidKeyReason = "unknown" | "bad_secret" | "revoked" | "expired" | "rotated";

/** A refusal, tagged by the OpenAI error code it maps to. */
export type AdmissionRefusal =
  | { ok: false; code: "invalid_api_key"; reason: InvalidKeyReason }
  | { ok: false; code: "origin_not_allowed"; origin: string }
  | { ok: false; code: "key_blocked" }
  | { ok: false; code: "model_not_allowed"; model: string }
  | {
      ok: false;
      code: "rate_limit_exceeded";
      limit: LimitName;
      /**
       * Whose limit: the key's, its end user's (browser token), its team's (`teamId`), or
       * `model`: the key's own limit for one model (`model_limits`), named in `model`.
       */
      scope: "key" | "end_user" | "team" | "model";
      teamId?: string;
      model?: string;
      /** The limit's value, and what this request asked of it. */
      limitValue: number;
      requested: number;
      retryAfterMs: number;
      /** The request alone exceeds the limit; waiting will not help. */
      tooLarge: boolean;
      rateLimit: RateLimitInfo;
    }
  | {
      ok: false;
      code: "insufficient_quota";
      budget: BudgetName;
      /** Whose budget: the key's, the browser token's end user's, or its team's (`teamId`). */
      scope: "key" | "end_user" | "team";
      teamId?: string;
      /** The budget, in pico-dollars like every amount here. */
      limitPicos: bigint;
      /** Settled spend and open reservations in the budget's period. */
      spentPicos: bigint;
      reservedPicos: bigint;
      /** The request's worst-case cost. */
      requestedPicos: bigint;
      /**
       * When a retry can succeed: soon when only open reservations are in the way, when the
       * budget's window ends otherwise, never (null) for a spent credit.
       */
      retryAfterMs: number | null;
      /** When the budget's window ends (epoch ms); null for the credit. */
      resetsAt: number | null;
      rateLimit: RateLimitInfo;
    };

/** An admitted request: what was reserved and the headers to send. */
export interface Admission {
  ok: true;
  /** The candidate models the key allows, in the order to try them. */
  models: string[];
  reservedTokens: number;
  /** The worst-case cost reserved against the key's budgets, in pico-dollars. */
  reservedPicos: bigint;
  rateLimit: RateLimitInfo;
}

/** What a bucket reports for OpenAI's `x-ratelimit-*` headers. */
export interface BucketSnapshot {
  limit: number;
  remaining: number;
  /** Milliseconds until the bucket is full again. */
  resetMs: number;
}

/** The key record as the KeyAccount holds it (times in epoch ms). */
export interface KeyRecord {
  id: string;
  name: string;
  status: KeyStatus;
  limits: Limits;
  /** Spending limits in micro-dollars. */
  budgets: Budgets;
  /** Its own limits per model, within the key's (`model_limits`). */
  modelLimits: Record<string, ModelLimits>;
  /** Where its soft-budget alerts go; null: the configuration's `alerts.webhook_url`. */
  alertWebhookUrl: string | null;
  allowedOrigins: string[];
  models: string[] | null;
  tier: KeyTier;
  /** Whether its requests may pick their region with `x-warmgate-region`. */
  allowRegionOverride: boolean;
  expiresAt: number | null;
  createdAt: number;
  updatedAt: number;
  revokedAt: number | null;
  /** When the key was blocked, while it is; null when it is not. */
  blockedAt: number | null;
  /** Its tags: every request of the key carries them on its ledger row. */
  tags: string[];
  /** Free metadata of the operator's, never read by the gateway. */
  metadata: Record<string, MetadataValue>;
  /** The team it belongs to, whose limits and budgets it is held to as well; null: none. */
  teamId: string | null;
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
  modelLimits?: Record<string, ModelLimits>;
  alertWebhookUrl?: string | null;
  allowedOrigins: string[];
  models: string[] | null;
  tier: KeyTier;
  allowRegionOverride?: boolean;
  expiresAt: number | null;
  tags?: string[];
  metadata?: Record<string, MetadataValue>;
  teamId?: string | null;
  now: number;
}

/** A partial change to a key; `models: null` allows every model, `expiresAt: null` removes expiry. */
export interface KeyUpdateInput {
  name?: string;
  limits?: Partial<Limits>;
  /** `periods` replaces the list; a credit set to null is removed. */
  budgets?: Partial<Budgets>;
  /** Replaces every model's limits. */
  modelLimits?: Record<string, ModelLimits>;
  alertWebhookUrl?: string | null;
  allowedOrigins?: string[];
  models?: string[] | null;
  tier?: KeyTier;
  allowRegionOverride?: boolean;
  expiresAt?: number | null;
  /** Blocks (true) or unblocks (false) the key; ignored for a revoked key. */
  blocked?: boolean;
  tags?: string[];
  metadata?: Record<string, MetadataValue>;
  /** Moves the key into a team (its allowance of the old one is given back), or out (null). */
  teamId?: string | null;
  now: number;
}

/** How a request presents itself to `admit`: an API key's hash or a verified browser token's scope. */
export type AdmitCredential =
  | { kind: "key"; secretHash: string }
  | {
      kind: "browser";
      /** The generation of the key secret that minted the token: it dies with that secret. */
      secretGeneration: number;
      /** End user id, or a per-token subject when the token names no user. */
      subject: string;
      limits: Limits;
      models: string[] | null;
      /** The end user's own budgets (no credit); absent: none. */
      budgets?: PeriodBudget[];
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
  /** The request's own tags (`x-warmgate-tags`); its row carries them and the key's. */
  tags?: string[];
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
  /** Whether the request may pick its region (the key's `allow_region_override`). */
  allowRegionOverride: boolean;
  /** The key's team, or null (a team-scoped response cache shares entries in it). */
  teamId: string | null;
  leaseExpiresAt: number;
  /**
   * Whether the key has a budget: then a cost above the reservation is billed only as far
   * as the budgets have room, which only the account knows when it settles.
   */
  budgeted: boolean;
};

/** The answer to `admit`. */
export type AdmitResult = AdmitOk | AdmissionRefusal;

/** What `admit` answers: the decision and where the call's writes stand. */
export type AdmitAnswer = AdmitResult & { commit: CommitStamp };

/** How a request ended. */
export type SettleOutcome = "ok" | "error" | "cancelled" | "timeout";

/** Real token usage, as OpenAI reports it (`cached_tokens`: prompt tokens the prefix cache served). */
export interface SettleUsage {
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens?: number;
}

/** One attempt at serving a request, as its usage record lists it. */
export interface RequestAttempt {
  region: string;
  /** The origin tried, or null when none could be (the region had no healthy one). */
  origin: string | null;
  /**
   * `served`: it answered the client; `busy`: it refused for overload (429, or 503 with
   * `retry-after`) and ran nothing; `failed`: another candidate was tried, or none was.
   */
  result: "served" | "busy" | "failed";
}

/**
 * One settlement from the edge. Its cost comes from the usage at the served model's
 * admitted price (at most the reserved cost); without usage it costs nothing and its
 * reserved tokens stay charged to the rate limit.
 */
export interface SettleInput {
  requestId: string;
  outcome: SettleOutcome;
  /** Every attempt at serving it, in order. */
  attempts?: RequestAttempt[];
  usage?: SettleUsage | null;
  /** The model that served the request, when it is not the one admitted (alias fallback). */
  model?: string | null;
  /**
   * Whether an origin began answering (default true). Without usage, a request no origin
   * began generated nothing: its tokens are given back at once.
   */
  originBegan?: boolean;
  /**
   * No END reached the edge and the request's origin could not say yet what it generated
   * (its item would not end there): the account releases the reservation and asks the
   * origins later, as for a lapsed lease.
   */
  usageUnknown?: boolean;
  /**
   * The admission as the edge holds it, used only when the account does not know the
   * request: a crash forgot its admission before it was written. The request is then
   * still settled and billed, as a settled row with nothing reserved.
   */
  admitted?: SettledAdmission | null;
  /** How the client saw it, for the account's metrics (docs/metrics.md). */
  metrics?: SettleMetrics;
  /** The request's own tags, for a row opened at its settlement (leased, or forgotten). */
  tags?: string[];
  /** Admitted under its isolate's lease: the tokens it took, its end user, when. */
  leased?: { reservedTokens: number; endUser: string | null; admittedAt: number };
  /** How the edge's response cache served it, when the cache was used. */
  cache?: SettleCache;
  now?: number;
}

/** What the edge knows of an admission: enough to bill the request if the account lost it. */
export interface SettledAdmission {
  /** The models it was admitted for, in the order tried, at their prices. */
  models: { model: string; price: ModelPrice }[];
  /** The worst-case cost it reserved (pico-dollars): billed up to this whatever the budgets' room, as agreed. */
  reservedPicos: bigint;
}

/** The answer to `settle`: applied once, or why nothing changed. */
export type SettleResult =
  | {
      settled: true;
      requestId: string;
      reservedTokens: number;
      usedTokens: number | null;
      /** The cost billed, in pico-dollars. */
      costPicos: bigint;
      late: boolean;
    }
  | {
      settled: false;
      requestId: string;
      /** `reconciling`: its usage is asked of the origins, and billed once found. */
      reason: "already_settled" | "unknown_request" | "reconciling";
    };

/** What `settleMany` answers: one result per input, in order, all of them committed. */
export interface SettleManyResult {
  results: SettleResult[];
  commit: CommitStamp;
}

/** What `check` compares: an API key's hash, or a verified browser token (its key's state only). */
export type CheckCredential =
  | { kind: "key"; secretHash: string }
  | { kind: "browser"; secretGeneration: number };

/**
 * Result of checking a credential without admitting a request (token minting, `/v1/models`):
 * with the generation of the secret it stands on, which the tokens it mints carry, and the
 * models the caller may use (its key's, its team's and its browser token's).
 */
export type KeyCheckResult =
  | {
      ok: true;
      record: KeyRecord;
      secretGeneration: number;
      /** The models the caller may use, as admission decides it (null: every model). */
      models: string[] | null;
    }
  | Extract<AdmissionRefusal, { code: "invalid_api_key" | "origin_not_allowed" | "key_blocked" }>;

/** A refusal of a credential. */
export type CredentialRefusal = Exclude<KeyCheckResult, { ok: true }>;

/**
 * The longest a write of the account waits in memory for its commit, which is the most a
 * crash can forget (docs/key-account.md): short, yet long enough for a busy key's requests
 * to share one commit instead of holding each answer for its own.
 */
export const ACCOUNT_WRITE_DELAY_MS = 50;

/**
 * How long a closed ledger row is kept (a repeated settle is recognised meanwhile; end-user,
 * tag and spend-log reads reach this far back).
 */
export const LEDGER_RETENTION_MS = 35 * 86_400_000;

/** Upper bounds of the request-duration buckets of a key's metrics, seconds. */
export const DURATION_BOUNDS_S = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
/** Upper bounds of the time-to-first-token buckets of a key's metrics, seconds. */
export const TTFT_BOUNDS_S = [0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
