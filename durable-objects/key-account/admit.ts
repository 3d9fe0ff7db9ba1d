/**
 * Admitting a request: the credential, then the pure admission policy (admission.ts) over
 * the key's current state, and on admission the reservation and its open ledger row, in
 * one synchronous turn (docs/key-account.md, "What a request reserves").
 */
import { refusedSample } from "./metrics.ts";
import { decideAdmission, rateLimitNow, type CandidateModel } from "./admission.ts";
import { hasBudgets } from "./budgets.ts";
import { hourOf } from "../../contracts/budget-periods.ts";
import { checkCredential } from "./credential.ts";
import { FREE, utcDay, worstCasePicos } from "../../contracts/pricing.ts";
import { KEY_SCOPE, NOT_CLOSED, type StoredCandidate, rowTags, storedCandidate } from "./schema.ts";
import { expireDue } from "./settle.ts";
import { type AccountStore, modelScope, userScope } from "./store.ts";
import { type PoolAsk, shortfall, usableModels } from "./team/pool.ts";
import type { TeamLink } from "./team/link.ts";
import type { TeamAllowance } from "../team-account/types.ts";
import { RESERVATION_LEASE_MS, type AdmitInput, type AdmitResult } from "./types.ts";

/** A request the key's lease of its team's allowance cannot hold: the team is asked for `need`. */
export interface TeamShort {
  ok: false;
  code: "team_short";
  need: TeamAllowance;
  /** The request's own tokens and money. */
  ask: PoolAsk;
}

// How often one admission asks the team before it is refused as busy: other requests of
// the key may take what a call brought before this one is decided again (each call admits
// at least one of them, and asks for all of them).
const TEAM_TRIES = 16;

/**
 * Admits or refuses a request (see {@link decide}); a request that its key's lease of its
 * team's allowance cannot hold waits for a call to the team, the only round trip teams add.
 */
export async function admitWithTeam(
  store: AccountStore,
  team: TeamLink,
  input: AdmitInput,
): Promise<AdmitResult> {
  let result = decide(store, input);
  for (let tries = 0; tries < TEAM_TRIES && !result.ok && result.code === "team_short"; tries++) {
    const refusal = await team.obtain(result.need, result.ask);
    // The team weighed what the key's lease lacked; the client is told the request's own
    // worst case, as the key's own refusal tells it.
    result =
      refusal === null
        ? decide(store, input)
        : refusal.code === "insufficient_quota"
          ? { ...refusal, requestedPicos: result.ask.picos }
          : refusal;
  }
  if (result.ok || result.code !== "team_short") {
    if (!result.ok && "scope" in result && result.scope === "team") {
      store.metrics.refuse(refusedSample(input.requestId, input.model, result.code, Date.now()));
    }
    return result;
  }
  // Still short after as many calls: the team's allowance is in other keys' hands.
  store.metrics.refuse(
    refusedSample(input.requestId, input.model, "rate_limit_exceeded", Date.now()),
  );
  const limits = store.key.record?.limits ?? { rpm: 1, tpm: 1, concurrency: 1 };
  const rateLimit = rateLimitNow(limits, store.scopeUsage(KEY_SCOPE, null), Date.now());
  return {
    ok: false,
    code: "rate_limit_exceeded",
    limit: "concurrency",
    scope: "team",
    teamId: store.team.pool?.teamId ?? "",
    limitValue: 0,
    requested: 1,
    retryAfterMs: 1_000,
    tooLarge: false,
    rateLimit,
  };
}

/** A requested lease, bounded to 1 s – 1 h (default {@link RESERVATION_LEASE_MS}). */
export function clampLease(leaseMs: number | undefined): number {
  if (leaseMs === undefined || !Number.isFinite(leaseMs)) return RESERVATION_LEASE_MS;
  return Math.min(60 * 60_000, Math.max(1_000, Math.floor(leaseMs)));
}

/**
 * Decides an admission from memory and applies it. Synchronous from first read to last
 * update: this is the atomic section.
 */
export function decide(store: AccountStore, input: AdmitInput): AdmitResult | TeamShort {
  const now = input.now ?? Date.now();
  const record = store.key.record;
  if (record === null) return { ok: false, code: "invalid_api_key", reason: "unknown" };
  const { credential } = input;
  const secret = checkCredential(store.key.secrets, credential, now);
  if (!secret.ok) {
    store.metrics.refuse(refusedSample(input.requestId, input.model, secret.code, now));
    return secret;
  }
  // A repeated admit (the edge retried the call) must not reserve twice. Request ids are
  // the edge's random ids, never reused: a closed row is not looked for (and a ledger
  // write never reopens one).
  const existing = store.ledger.openRow(input.requestId);
  if (existing !== undefined) {
    return {
      ok: true,
      models: existing.candidates.map(([model]) => model),
      reservedTokens: existing.reservedTokens,
      reservedPicos: existing.reservedPicos,
      rateLimit: rateLimitNow(record.limits, store.scopeUsage(KEY_SCOPE, null), now),
      requestId: input.requestId,
      tier: record.tier,
      allowRegionOverride: record.allowRegionOverride,
      teamId: record.teamId,
      leaseExpiresAt: existing.expiresAt,
      budgeted: hasBudgets(record.budgets),
    };
  }

  expireDue(store, now);
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
    worstCasePicos: worstCasePicos(candidate.price, input.promptTokens, candidate.maxTokens),
  }));
  const day = utcDay(now);
  const team = store.team.pool;
  const hour = hourOf(now);
  const userBudgets = credential.kind === "browser" ? (credential.budgets ?? []) : [];
  const outcome = decideAdmission({
    key: {
      status: record.status,
      expiresAt: record.expiresAt,
      models: usableModels(record.models, team, endUser?.models ?? null),
      allowedOrigins: record.allowedOrigins,
      limits: record.limits,
      modelLimits: record.modelLimits,
    },
    endUser,
    usage: {
      key: store.scopeUsage(KEY_SCOPE, null),
      endUser: subject === null ? null : store.scopeUsage(userScope(subject), subject),
      models: Object.fromEntries(
        Object.keys(record.modelLimits).map((model) => [
          model,
          store.buckets.of(modelScope(model)),
        ]),
      ),
    },
    budgets: {
      key: store.spend.lines(record.budgets, now, KEY_SCOPE),
      endUser:
        subject === null
          ? []
          : store.spend.lines(
              { periods: userBudgets, creditMicros: null },
              now,
              userScope(subject),
            ),
    },
    request: {
      candidates,
      promptTokens: input.promptTokens,
      origin: input.origin ?? null,
      now,
    },
  });
  const { decision, state } = outcome;
  if (!decision.ok) {
    store.metrics.refuse(refusedSample(input.requestId, input.model, decision.code, now));
    return decision;
  }

  // Within the key's lease of its team's allowance, or the team is asked (admitWithTeam).
  const use =
    team === null
      ? null
      : {
          reservedPicos: store.spend.lifetime().reservedPicos,
          inFlight: store.scopeUsage(KEY_SCOPE, null).inFlight,
        };
  if (team !== null && use !== null) {
    const ask = { tokens: decision.reservedTokens, picos: decision.reservedPicos };
    const need = shortfall(team, ask, use);
    if (need !== null) return { ok: false, code: "team_short", need, ask };
  }

  const stored: StoredCandidate[] = offered
    .filter((candidate) => decision.models.includes(candidate.model))
    .map(({ model, price }) => storedCandidate(model, price));
  const leaseExpiresAt = now + clampLease(input.leaseMs);
  store.buckets.put(KEY_SCOPE, state.key);
  if (subject !== null && state.endUser !== null) {
    store.buckets.put(userScope(subject), state.endUser);
  }
  for (const [model, buckets] of Object.entries(state.models)) {
    store.buckets.put(modelScope(model), buckets);
  }
  store.ledger.open({
    requestId: input.requestId,
    state: "open",
    model: decision.models[0] ?? input.model,
    day,
    hour,
    subject,
    subjectTpm: endUser?.limits.tpm ?? null,
    endUser: input.endUser ?? null,
    tags: rowTags(record.tags, input.tags),
    teamId: record.teamId,
    reservedTokens: decision.reservedTokens,
    reservedPicos: decision.reservedPicos,
    candidates: stored,
    createdAt: now,
    expiresAt: leaseExpiresAt,
    ...NOT_CLOSED,
  });
  store.spend.add(hour, { reservedPicos: decision.reservedPicos, settledPicos: 0n }, subject);
  store.metrics.admitted(input.requestId);
  if (use !== null) {
    store.team.admitted(decision.reservedTokens, decision.reservedPicos, use.inFlight + 1, now);
  }
  return {
    ...decision,
    requestId: input.requestId,
    tier: record.tier,
    allowRegionOverride: record.allowRegionOverride,
    teamId: record.teamId,
    leaseExpiresAt,
    budgeted: hasBudgets(record.budgets),
  };
}
