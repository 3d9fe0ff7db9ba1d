/**
 * The admission policy of one API key, as a pure function: given the key's policy, its
 * current counters and spend, and a request, decide admit or refuse and return the new
 * bucket state and what to reserve. `KeyAccount` reads the inputs from its store, calls
 * `decideAdmission` and applies the result in the same synchronous turn, which is what
 * makes the decision atomic. Nothing here touches storage or the clock.
 * See docs/key-account.md, "What a request reserves".
 */
import { take, snapshot, type BucketState, fullBucket } from "./token-bucket.ts";
import { type BudgetLine, CONCURRENCY_RETRY_MS, budgetRefusal } from "./budgets.ts";
import type {
  Admission,
  AdmissionRefusal,
  BucketSnapshot,
  KeyStatus,
  Limits,
  RateLimitInfo,
} from "./types.ts";
import type { ModelLimits } from "./budget-types.ts";
import { maxPicos } from "../../contracts/pricing.ts";

/** A model that may serve the request, with what it would cost at most. */
export interface CandidateModel {
  model: string;
  /** Completion tokens it may produce (`max_tokens`, or the rest of its window). */
  maxTokens: number;
  /** Its worst-case cost in pico-dollars (see pricing.ts `worstCasePicos`). */
  worstCasePicos: bigint;
}

/** What the key's record says about admission. */
export interface KeyPolicy {
  status: KeyStatus;
  /** Epoch ms after which the key is refused, or null for no expiry. */
  expiresAt: number | null;
  /** Models the key may call, or null for every model. */
  models: readonly string[] | null;
  /** Browser origins the key allows; requests without an Origin are not browser requests. */
  allowedOrigins: readonly string[];
  limits: Limits;
  /** The key's own limits per model (`model_limits`). */
  modelLimits: Readonly<Record<string, ModelLimits>>;
}

/** The narrowed scope a browser token carries for one end user. */
export interface EndUserPolicy {
  /** The end user id, or a per-token subject when the token names no user. */
  subject: string;
  limits: Limits;
  models: readonly string[] | null;
}

/** The stored counters of one scope (the key, or one end user); null buckets are full. */
export interface ScopeUsage {
  requests: BucketState | null;
  tokens: BucketState | null;
  /** Open reservations in this scope. */
  inFlight: number;
}

/** A limited model's buckets after a decision; null for a dimension it does not limit. */
export interface ModelBuckets {
  requests: BucketState | null;
  tokens: BucketState | null;
}

/** Bucket state to persist for one scope after a decision. */
export interface ScopeBuckets {
  requests: BucketState;
  tokens: BucketState;
}

/** The request being admitted. */
export interface AdmissionRequest {
  /** The models that may serve it, in the order to try them (one, or an alias's list). */
  candidates: readonly CandidateModel[];
  promptTokens: number;
  /** The browser `Origin` header, or null for server-to-server calls. */
  origin: string | null;
  now: number;
}

/** Everything `decideAdmission` needs, loaded by the shell in one synchronous turn. */
export interface AdmissionInput {
  key: KeyPolicy;
  endUser: EndUserPolicy | null;
  /** `models`: the buckets of each limited model (a missing one is full). */
  usage: {
    key: ScopeUsage;
    endUser: ScopeUsage | null;
    models?: Readonly<Record<string, Omit<ScopeUsage, "inFlight">>>;
  };
  /** The budgets in force now with their windows' spend: the key's, and the end user's. */
  budgets: { key: readonly BudgetLine[]; endUser: readonly BudgetLine[] };
  request: AdmissionRequest;
}

/** The decision and the state to persist when it admits. */
export interface AdmissionOutcome {
  state: {
    key: ScopeBuckets;
    endUser: ScopeBuckets | null;
    /** The buckets of each limited model the request may be served by (null: unlimited). */
    models: Record<string, ModelBuckets>;
  };
  decision: Admission | AdmissionRefusal;
}

/** Whether `model` is in `allowed` (null allows every model). */
export function modelAllowed(allowed: readonly string[] | null, model: string): boolean {
  return allowed === null || allowed.includes(model);
}

/**
 * Why the key refuses a request at `now` whatever it asks for (revoked, expired, a browser
 * origin it does not allow, or blocked), or null: the one check of admission and `check`.
 * Blocked comes after the origin, so a browser may read that refusal.
 */
export function keyRefusal(
  key: Pick<KeyPolicy, "status" | "expiresAt" | "allowedOrigins">,
  origin: string | null,
  now: number,
): Extract<
  AdmissionRefusal,
  { code: "invalid_api_key" | "origin_not_allowed" | "key_blocked" }
> | null {
  if (key.status === "revoked") return { ok: false, code: "invalid_api_key", reason: "revoked" };
  if (key.expiresAt !== null && now >= key.expiresAt) {
    return { ok: false, code: "invalid_api_key", reason: "expired" };
  }
  if (origin !== null && !key.allowedOrigins.includes(origin)) {
    return { ok: false, code: "origin_not_allowed", origin };
  }
  if (key.status === "blocked") return { ok: false, code: "key_blocked" };
  return null;
}

/**
 * Decides one admission: status, origin, models, concurrency, requests, tokens and
 * budgets, all or nothing.
 */
export function decideAdmission(input: AdmissionInput): AdmissionOutcome {
  const { key, endUser, usage, request } = input;
  const { now } = request;
  const keyBuckets = bucketsOf(usage.key, key.limits, now);
  const userBuckets =
    endUser === null ? null : bucketsOf(usage.endUser ?? emptyUsage(), endUser.limits, now);
  const unchanged = { key: keyBuckets, endUser: userBuckets, models: {} };
  const refuse = (decision: AdmissionRefusal): AdmissionOutcome => ({ state: unchanged, decision });

  const refusedKey = keyRefusal(key, request.origin, now);
  if (refusedKey !== null) return refuse(refusedKey);
  const allowed = request.candidates.filter(
    (candidate) =>
      modelAllowed(key.models, candidate.model) &&
      modelAllowed(endUser?.models ?? null, candidate.model),
  );
  if (allowed.length === 0) {
    return refuse({
      ok: false,
      code: "model_not_allowed",
      model: request.candidates[0]?.model ?? "",
    });
  }

  // Reserved for whichever allowed model ends up serving: the largest of each.
  const maxTokens = Math.max(...allowed.map((candidate) => candidate.maxTokens));
  const reservedPicos = allowed.reduce(
    (most, candidate) => maxPicos(most, candidate.worstCasePicos),
    0n,
  );
  const tokens = request.promptTokens + maxTokens;
  const checks: ScopeCheck[] = [
    { scope: "key", limits: key.limits, buckets: keyBuckets, usage: usage.key },
  ];
  if (endUser !== null && userBuckets !== null) {
    checks.push({
      scope: "end_user",
      limits: endUser.limits,
      buckets: userBuckets,
      usage: usage.endUser ?? emptyUsage(),
    });
  }

  // Every scope and every limit is checked before anything is taken, so a refusal
  // reserves nothing; the refusal reported is the one that asks for the longest wait.
  let worst: RateRefusal | null = null;
  const taken: ScopeBuckets[] = [];
  for (const check of checks) {
    const refusals: Omit<RateRefusal, "rateLimit">[] = [];
    if (check.usage.inFlight >= check.limits.concurrency) {
      refusals.push({
        ok: false,
        code: "rate_limit_exceeded",
        limit: "concurrency",
        scope: check.scope,
        limitValue: check.limits.concurrency,
        requested: 1,
        retryAfterMs: CONCURRENCY_RETRY_MS,
        tooLarge: false,
      });
    }
    const requests = take(check.buckets.requests, check.limits.rpm, 1, now);
    if (!requests.decision.ok) {
      refusals.push({
        ok: false,
        code: "rate_limit_exceeded",
        limit: "requests",
        scope: check.scope,
        limitValue: check.limits.rpm,
        requested: 1,
        retryAfterMs: requests.decision.retryAfterMs,
        tooLarge: requests.decision.tooLarge,
      });
    }
    const tokenTake = take(check.buckets.tokens, check.limits.tpm, tokens, now);
    if (!tokenTake.decision.ok) {
      refusals.push({
        ok: false,
        code: "rate_limit_exceeded",
        limit: "tokens",
        scope: check.scope,
        limitValue: check.limits.tpm,
        requested: tokens,
        retryAfterMs: tokenTake.decision.retryAfterMs,
        tooLarge: tokenTake.decision.tooLarge,
      });
    }
    for (const refusal of refusals) {
      if (worst === null || refusal.retryAfterMs > worst.retryAfterMs) {
        worst = { ...refusal, rateLimit: rateLimitOf(checks, now) };
      }
    }
    taken.push({ requests: requests.state, tokens: tokenTake.state });
  }
  // A model with its own limits counts every request that it may serve (docs/key-account.md).
  const models: Record<string, ModelBuckets> = {};
  for (const candidate of allowed) {
    const limits = key.modelLimits[candidate.model];
    if (limits === undefined || candidate.model in models) continue;
    const stored = usage.models?.[candidate.model];
    const checked = checkModel(candidate.model, limits, stored, tokens, now);
    models[candidate.model] = checked.buckets;
    for (const refusal of checked.refusals) {
      if (worst === null || refusal.retryAfterMs > worst.retryAfterMs) {
        worst = { ...refusal, rateLimit: rateLimitOf(checks, now) };
      }
    }
  }
  if (worst !== null) return refuse(worst);

  const overdraw =
    budgetRefusal(input.budgets.key, reservedPicos, now) ??
    budgetRefusal(input.budgets.endUser, reservedPicos, now);
  if (overdraw !== null) {
    const scope =
      budgetRefusal(input.budgets.key, reservedPicos, now) === null ? "end_user" : "key";
    return refuse({ ...overdraw, scope, rateLimit: rateLimitOf(checks, now) });
  }

  const after = checks.map((check, i) => ({ ...check, buckets: taken[i] ?? check.buckets }));
  const state = { key: taken[0] ?? keyBuckets, endUser: taken[1] ?? null, models };
  return {
    state,
    decision: {
      ok: true,
      models: allowed.map((candidate) => candidate.model),
      reservedTokens: tokens,
      reservedPicos,
      rateLimit: rateLimitOf(after, now),
    },
  };
}

/** The rate-limit header values of one scope as of `now`, taking nothing. */
export function rateLimitNow(limits: Limits, usage: ScopeUsage, now: number): RateLimitInfo {
  return rateLimitOf(
    [{ scope: "key", limits, buckets: bucketsOf(usage, limits, now), usage }],
    now,
  );
}

/**
 * Token units to give back to the buckets once the request ended (negative charges more):
 * the reservation less what was used; all of it when no origin began answering.
 */
export function tokenCorrection(
  reservedTokens: number,
  usedTokens: number | null,
  originBegan = true,
): number {
  if (usedTokens !== null) return reservedTokens - usedTokens;
  // Without usage the reservation stands, as an origin that began may have done the work.
  return originBegan ? 0 : reservedTokens;
}

type RateRefusal = Extract<AdmissionRefusal, { code: "rate_limit_exceeded" }>;

// One model's own limits: each dimension it limits, checked and taken like the key's.
function checkModel(
  model: string,
  limits: ModelLimits,
  usage: Omit<ScopeUsage, "inFlight"> | undefined,
  tokens: number,
  now: number,
): { buckets: ModelBuckets; refusals: Omit<RateRefusal, "rateLimit">[] } {
  const refusals: Omit<RateRefusal, "rateLimit">[] = [];
  const dimension = (limit: "requests" | "tokens", capacity: number | null, amount: number) => {
    const stored = (limit === "requests" ? usage?.requests : usage?.tokens) ?? null;
    if (capacity === null) return null;
    const taking = take(stored ?? fullBucket(capacity, now), capacity, amount, now);
    if (!taking.decision.ok) {
      refusals.push({
        ok: false,
        code: "rate_limit_exceeded",
        limit,
        scope: "model",
        model,
        limitValue: capacity,
        requested: amount,
        retryAfterMs: taking.decision.retryAfterMs,
        tooLarge: taking.decision.tooLarge,
      });
    }
    return taking.state;
  };
  const buckets = {
    requests: dimension("requests", limits.rpm, 1),
    tokens: dimension("tokens", limits.tpm, tokens),
  };
  return { buckets, refusals };
}

interface ScopeCheck {
  scope: "key" | "end_user";
  limits: Limits;
  buckets: ScopeBuckets;
  usage: ScopeUsage;
}

function emptyUsage(): ScopeUsage {
  return { requests: null, tokens: null, inFlight: 0 };
}

function bucketsOf(usage: ScopeUsage, limits: Limits, now: number): ScopeBuckets {
  return {
    requests: usage.requests ?? fullBucket(limits.rpm, now),
    tokens: usage.tokens ?? fullBucket(limits.tpm, now),
  };
}

// Headers report, per dimension, whichever scope has the least left: that is the
// limit the caller will meet first.
function rateLimitOf(checks: readonly ScopeCheck[], now: number): RateLimitInfo {
  let requests: BucketSnapshot | null = null;
  let tokens: BucketSnapshot | null = null;
  for (const check of checks) {
    const r = snapshot(check.buckets.requests, check.limits.rpm, now);
    const t = snapshot(check.buckets.tokens, check.limits.tpm, now);
    if (requests === null || r.remaining < requests.remaining) requests = r;
    if (tokens === null || t.remaining < tokens.remaining) tokens = t;
  }
  return {
    requests: requests ?? { limit: 0, remaining: 0, resetMs: 0 },
    tokens: tokens ?? { limit: 0, remaining: 0, resetMs: 0 },
  };
}
