/**
 * Authentication and admission of `/v1/*` requests (docs/edge.md): `authenticate` checks
 * the bearer credential at the edge with no storage call; `verifyCredential` asks the key's
 * KeyAccount, read-only, whether the key is live; `admitCompletion` makes the one KeyAccount
 * call of the hot path (admit and reserve), registers the settlement, and puts OpenAI's
 * `x-ratelimit-*` headers and, on JSON answers, `x-warmgate-cost-usd` on the response.
 */
import { TAGS_HEADER, requestTags } from "../request/request-tags.ts";
import { writeRequestEvent } from "../observability/analytics.ts";
import type { Context } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import {
  authenticateBearer,
  checkCredential,
  type Credential,
  keyAccount,
  queueSettlement,
  refusalError,
  renewLease,
  settleRequest,
} from "../accounts/account-client.ts";
import { FREE, billedPicos, formatUsd } from "../../contracts/pricing.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import { completionAllowance } from "./completion-plan.ts";
import { waitUntilOf } from "./request-context.ts";
import { RATE_LIMIT_HEADER, rateLimitHeaders } from "../accounts/rate-limit-headers.ts";
import type { LeasedAdmission } from "../accounts/leases.ts";
import {
  admitExactly,
  admitUnderLease,
  keepLease,
  leaseEnded,
  localRequest,
  settleWaitMs,
} from "./leased-admission.ts";
import type { SettledRequest } from "../accounts/settlement.ts";
import type { AdmitOk, SettleInput } from "../../durable-objects/key-account/types.ts";
import type { SettleCache, SettleMetrics } from "../../durable-objects/key-account/settle-types.ts";

/** Response header with a non-streaming completion's exact cost in USD (six to twelve places). */
export const COST_HEADER = "x-warmgate-cost-usd";

/**
 * A request's lease in its key's account: while its client is served the edge renews it
 * every {@link LEASE_RENEW_MS}; a request cut by a crash gives back its slot and
 * reservation within a lease, and is then settled from its origin's record.
 */
export const LEASE_MS = 20_000;
export const LEASE_RENEW_MS = 5_000;

/** Sets `caller` and `credential` from the `Authorization` header, or answers 401/403. */
export function authenticate() {
  return createMiddleware<AppEnv>(async function authenticateCaller(c, next) {
    const origin = c.req.header("origin") ?? null;
    const { apiKeys, browserTokens } = c.get("edge");
    const auth = await authenticateBearer(c.env, c.req.header("authorization"), {
      now: Date.now(),
      origin,
      apiKeys,
      browserTokens,
    });
    if (!auth.ok) throw auth.error;
    const { ok: _ok, ...credential } = auth;
    c.set("credential", credential);
    c.set("caller", { kind: credential.kind, keyId: credential.keyId });
    // A browser token carries the origins its key allowed when it was minted, signed.
    c.set("allowedOrigin", credential.kind === "browser" ? origin : null);
    await next();
  });
}

/**
 * Checks the caller's credential with its KeyAccount without consuming any limit: a
 * revoked, expired or rotated-out key is refused, as is a browser origin the key no longer
 * allows. Answers the key's record and the models the caller may use.
 */
export async function checkCaller(c: Context<AppEnv>) {
  const origin = c.req.header("origin") ?? null;
  const credential = c.get("credential");
  const result = await checkCredential(c.env, credential, { origin });
  if (!result.ok) {
    if (result.code === "origin_not_allowed") c.set("allowedOrigin", null);
    throw refusalError(result, credential.keyId, credential.kind);
  }
  if (origin !== null) c.set("allowedOrigin", origin);
  return { record: result.record, models: result.models };
}

/** {@link checkCaller} as a middleware. */
export function verifyCredential() {
  return createMiddleware<AppEnv>(async function verifyWithAccount(c, next) {
    await checkCaller(c);
    await next();
  });
}

/** Admits the planned completion in its key's account; refusals are OpenAI's 401/403/429. */
export function admitCompletion() {
  return createMiddleware<AppEnv>(async function admitToAccount(c, next) {
    const credential = c.get("credential");
    const plan = c.get("plan");
    const requestId = c.get("requestId");
    const settlement = c.get("settlement");
    const origin = c.req.header("origin") ?? null;
    const { body } = c.get("completion");
    // A bad header is refused before anything is registered or reserved.
    const tags = requestTags(c.req.header(TAGS_HEADER));
    // Registered before the call: if the call fails after the account committed, the
    // settlement still closes the reservation. A refusal reserved nothing: no call then.
    let refused = false;
    let renewal: ReturnType<typeof setInterval> | null = null;
    // Admitted under the isolate's lease: its slot there is freed once, when its work ends,
    // as is its place among the key's requests in flight here (`key-requests.ts`).
    let leased: LeasedAdmission | null = null;
    let ended: (() => void) | null = null;
    const freeSlot = () => {
      ended?.();
      ended = null;
      if (leased !== null) leaseEnded(c, leased);
      leased = null;
    };
    settlement.onSettled(async (settled) => {
      if (renewal !== null) clearInterval(renewal);
      if (refused) return;
      const input = settleInput(c, settled);
      freeSlot();
      const admission: AdmitOk | undefined = c.get("admission");
      if (c.env.ANALYTICS !== undefined && input.metrics !== undefined && admission !== undefined) {
        const cost = usageCost(c.get("config"), settled, admission.models, input.cache);
        writeRequestEvent(
          c.env.ANALYTICS,
          credential.keyId,
          admission.tier,
          settled,
          input.metrics,
          cost,
        );
      }
      const { settlements } = c.get("edge");
      await queueSettlement(c.env, settlements, credential.keyId, input, settleWaitMs(c));
    });
    // A client that went away before its usage is known frees its slot and reservation at
    // once; the settlement that follows bills what was generated.
    settlement.onReleased(async (released) => {
      if (renewal !== null) clearInterval(renewal);
      renewal = null;
      if (refused) return;
      const input = { ...settleInput(c, released), usageUnknown: true };
      freeSlot();
      const { settlements } = c.get("edge");
      await queueSettlement(c.env, settlements, credential.keyId, input, settleWaitMs(c));
    });
    // Every prompt and every sequence (`n`, `best_of`, a prompt list) is reserved: a client
    // never receives more than its reservation covers.
    const models = plan.models.length > 0 ? plan.models : [plan.model];
    const candidates = models.map((model) => ({
      model: model.id,
      maxTokens: completionAllowance(plan, model),
      price: model.price,
    }));
    const request = localRequest(candidates, plan.totalPromptTokens, origin);
    const endUser = endUserOf(credential, body.user);
    leased = admitUnderLease(c, request, endUser);
    if (leased !== null) {
      // The lease names its requests, so that its account can ask about any it never hears of.
      c.set("requestId", leased.admission.requestId);
      settlement.rename(leased.admission.requestId);
      c.set("leased", { admittedAt: leased.admittedAt, endUser });
    }
    const [first, ...rest] = candidates;
    const result =
      leased?.admission ??
      (await admitExactly(
        c,
        {
          requestId,
          model: first?.model ?? plan.model.id,
          promptTokens: plan.totalPromptTokens,
          maxTokens: first?.maxTokens ?? 0,
          price: first?.price ?? plan.model.price,
          fallbacks: rest,
          endUser,
          ...(tags.length > 0 && { tags }),
          origin,
          leaseMs: LEASE_MS,
        },
        request,
      ));
    if (!result.ok) {
      refused = true;
      // Every check after the origin's passed it, so the browser may read the refusal.
      const originChecked =
        result.code !== "invalid_api_key" && result.code !== "origin_not_allowed";
      c.set("allowedOrigin", originChecked ? origin : null);
      throw refusalError(result, credential.keyId, credential.kind);
    }
    c.set("admission", result);
    c.set("allowedOrigin", origin);
    ended = c.get("edge").keyRequests.started(credential.keyId);
    // A timer, not a promise chain: each renewal is its own call, kept alive by this request.
    const waitUntil = waitUntilOf(c);
    if (!settlement.settled && leased !== null) {
      // Its lease, not its own row, is what the account must hear of while it is served.
      renewal = setInterval(() => keepLease(c, endUser), c.get("config").leases.windowMs / 4);
    } else if (!settlement.settled) {
      renewal = setInterval(() => {
        waitUntil(renewLease(c.env, credential.keyId, requestId, LEASE_MS));
      }, LEASE_RENEW_MS);
    }
    await next();
    // A refusal after attempts an origin may have begun is billed once their origins said
    // what they generated, after the answer, and one whose origins did not say is billed
    // by its account later: neither has a cost header.
    const unserved = settlement.record === null && settlement.gaveUp.length > 0;
    const unknown = settlement.record?.usageUnknown === true;
    if (plan.delivery === "whole" && !unserved && !unknown) {
      // A whole answer was read up to the origin's END, which carries the usage, before its
      // headers went out (`Lifecycle.whole` in delivery/response.ts): the request is settled,
      // so its headers can carry its cost.
      const settled = settlement.record;
      let cost = usageCost(c.get("config"), settled, result.models, settleCache(c));
      // Up to its reservation a request is billed exactly this; above it only as far as the
      // key's budgets have room, which its account decides: ask it (the queued settlement
      // then finds the request settled).
      if (settled !== null && result.budgeted && cost > result.reservedPicos) {
        cost = await settledCost(c.env, credential.keyId, settleInput(c, settled));
      }
      setHeaders(c, { [COST_HEADER]: formatUsd(cost) });
    }
    // An answer from the origins carries them already (`routes/completions.ts`); a refusal
    // or an answer made elsewhere (the response cache) gets them here.
    if (!c.res.headers.has(RATE_LIMIT_HEADER)) setHeaders(c, rateLimitHeaders(result.rateLimit));
  });
}

/**
 * The end user a request is recorded for: a browser token's user, whom its signature
 * vouches for, over the body's `user` (which the browser could set to anything).
 */
export function endUserOf(credential: Credential, bodyUser: unknown): string | null {
  if (credential.kind === "browser" && credential.scope.user !== null) return credential.scope.user;
  return typeof bodyUser === "string" ? bodyUser : null;
}

/**
 * The cost of a settled request's usage at the served model's price, in pico-dollars
 * (nothing without usage; a response-cache hit at its share of the price).
 */
export function usageCost(
  config: ResolvedConfig,
  settled: SettledRequest | null,
  allowed: readonly string[],
  cache?: SettleCache,
): bigint {
  if (settled === null || settled.usage === null) return 0n;
  const model = config.models.find((m) => m.id === settled.model && allowed.includes(m.id));
  return billedPicos(
    {
      promptTokens: settled.usage.prompt_tokens,
      cachedTokens: settled.usage.cached_tokens,
      completionTokens: settled.usage.completion_tokens,
    },
    model?.price ?? FREE,
    null,
    cache?.result === "hit" ? cache.pricePpm : undefined,
  );
}

// How the response cache served the request, for its settlement; absent when it was not used.
function settleCache(c: Context<AppEnv>): SettleCache | undefined {
  const cache = c.get("cache");
  if (cache === undefined || cache.result === "bypass") return undefined;
  return { result: cache.result, bytes: cache.bytes, pricePpm: cache.settings.pricePpm };
}

// A request's settlement, with its admission as this edge holds it (the admitted models at
// their configured prices, and the reserved cost): an account that forgot the admission in
// a crash settles and bills the request from it.
function settleInput(c: Context<AppEnv>, settled: SettledRequest): SettleInput {
  const input: SettleInput = {
    requestId: settled.requestId,
    outcome: settled.outcome,
    usage: settled.usage,
    model: settled.model,
    originBegan: settled.originBegan,
    ...(settled.usageUnknown === true && { usageUnknown: true }),
    attempts: c.get("settlement").attempts,
    metrics: settleMetrics(c.get("settlement").startedAt, settled),
  };
  // For a row opened only now (leased, or forgotten in a crash); validated at admission.
  const tags = requestTags(c.req.header(TAGS_HEADER));
  if (tags.length > 0) input.tags = tags;
  const cache = settleCache(c);
  if (cache !== undefined) input.cache = cache;
  // Admitted under a lease: the account opens its row only now, from what the edge held.
  const leased = c.get("leased");
  const admitted: AdmitOk | undefined = c.get("admission");
  if (leased !== undefined && admitted !== undefined) {
    input.leased = { reservedTokens: admitted.reservedTokens, ...leased };
  }
  // Unset when the admit call failed: then the request was never admitted.
  const admission: AdmitOk | undefined = c.get("admission");
  if (admission === undefined) return input;
  const { models } = c.get("config");
  return {
    ...input,
    admitted: {
      models: admission.models.map((id) => ({
        model: id,
        price: models.find((model) => model.id === id)?.price ?? FREE,
      })),
      reservedPicos: admission.reservedPicos,
    },
  };
}

/** How the client saw a settled request, for its account's metrics (docs/metrics.md). */
export function settleMetrics(startedAt: number, settled: SettledRequest): SettleMetrics {
  const firstByteAt = settled.firstByteAt ?? null;
  return {
    region: settled.region,
    status: settled.status,
    durationMs: Math.max(0, Date.now() - startedAt),
    ttftMs: firstByteAt === null ? null : Math.max(0, firstByteAt - startedAt),
  };
}

// Settles now and reads what the account billed (from the ledger if it was settled already).
async function settledCost(env: Env, keyId: string, input: SettleInput): Promise<bigint> {
  const result = await settleRequest(env, keyId, input);
  if (result.settled) return result.costPicos;
  const found = await keyAccount(env, keyId).record({ requestId: input.requestId });
  return found.ok && found.record !== null ? found.record.costPicos : 0n;
}

/** Sets headers on the response, re-wrapping one whose headers are immutable. */
export function setHeaders(c: Context<AppEnv>, headers: Record<string, string>): void {
  try {
    for (const [name, value] of Object.entries(headers)) c.res.headers.set(name, value);
  } catch {
    // A response passed through from fetch() has immutable headers (no copy of the body).
    c.res = new Response(c.res.body, c.res);
    for (const [name, value] of Object.entries(headers)) c.res.headers.set(name, value);
  }
}
