/**
 * Authentication and admission of `/v1/*` requests against per-key accounts.
 *
 * - {@link authenticate} (every `/v1/*` route) checks the bearer credential at the edge,
 *   with no storage call: a malformed or forged key, or a bad browser token, is a 401.
 * - {@link verifyCredential} (routes that consume nothing, like `/v1/models`) asks the
 *   key's KeyAccount, read-only, whether the key is live (revoked and expired keys fail).
 * - {@link admitCompletion} (completion routes, after the body is validated and planned)
 *   makes the one KeyAccount call of the hot path: admit and reserve, atomically. It
 *   registers the settlement that releases the reservation however the request ends, and
 *   puts OpenAI's `x-ratelimit-*` headers on every response of the admitted request.
 */
import type { Context } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import { corsHeaders } from "../browser-tokens.ts";
import {
  admitRequest,
  authenticateBearer,
  checkCredential,
  queueSettlement,
  refusalError,
} from "../key-auth.ts";
import { rateLimitHeaders } from "../rate-limit-headers.ts";

/** Time a reservation outlives the request timeout before the key's alarm releases it. */
export const LEASE_MARGIN_MS = 60_000;

/** Sets `caller` and `credential` from the `Authorization` header, or answers 401/403. */
export function authenticate() {
  return createMiddleware<AppEnv>(async function authenticateCaller(c, next) {
    const origin = c.req.header("origin") ?? null;
    const auth = await authenticateBearer(c.env, c.req.header("authorization"), {
      now: Date.now(),
      origin,
    });
    if (!auth.ok) throw auth.error;
    const { ok: _ok, ...credential } = auth;
    c.set("credential", credential);
    c.set("caller", { kind: credential.kind, keyId: credential.keyId });
    // A browser token carries the origins its key allowed when it was minted, signed.
    c.set("allowedOrigin", credential.kind === "browser" ? origin : null);
    await next();
    const allowed = c.get("allowedOrigin");
    if (origin !== null && allowed === origin) setHeaders(c, corsHeaders(origin));
  });
}

/**
 * Checks the credential with its KeyAccount without consuming any limit: a revoked,
 * expired or rotated-out key is refused, as is a browser origin the key no longer allows.
 */
export function verifyCredential() {
  return createMiddleware<AppEnv>(async function verifyWithAccount(c, next) {
    const origin = c.req.header("origin") ?? null;
    const { credential } = c.var;
    const result = await checkCredential(c.env, credential, { origin });
    if (!result.ok) {
      if (result.code === "origin_not_allowed") c.set("allowedOrigin", null);
      throw refusalError(result, credential.keyId);
    }
    if (origin !== null) c.set("allowedOrigin", origin);
    await next();
  });
}

/** Admits the planned completion in its key's account; refusals are OpenAI's 401/403/429. */
export function admitCompletion() {
  return createMiddleware<AppEnv>(async function admitToAccount(c, next) {
    const { credential, plan, requestId, settlement, config } = c.var;
    const origin = c.req.header("origin") ?? null;
    const { body } = c.var.completion;
    // Registered before the call: if the call fails after the account committed, the
    // settlement still closes the reservation. A refusal reserved nothing: no call then.
    let refused = false;
    settlement.onSettled(async (settled) => {
      if (refused) return;
      await queueSettlement(c.env, credential.keyId, {
        requestId: settled.requestId,
        outcome: settled.outcome,
        usage: settled.usage,
        model: settled.model,
      });
    });
    const result = await admitRequest(c.env, credential, {
      requestId,
      model: plan.model.id,
      promptTokens: plan.promptTokens,
      // Unbounded: the rest of the context window is what the completion may use.
      maxTokens: plan.maxTokens ?? Math.max(0, plan.model.max_model_len - plan.promptTokens),
      endUser: typeof body.user === "string" ? body.user : null,
      origin,
      leaseMs: config.limits.request_timeout_ms + LEASE_MARGIN_MS,
    });
    if (!result.ok) {
      refused = true;
      // Every check after the origin's passed it, so the browser may read the refusal.
      const originChecked =
        result.code !== "invalid_api_key" && result.code !== "origin_not_allowed";
      c.set("allowedOrigin", originChecked ? origin : null);
      throw refusalError(result, credential.keyId);
    }
    c.set("admission", result);
    c.set("allowedOrigin", origin);
    await next();
    setHeaders(c, rateLimitHeaders(result.rateLimit));
  });
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
