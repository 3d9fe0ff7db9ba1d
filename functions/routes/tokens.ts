/**
 * `POST /v1/tokens`, where a customer's backend mints a browser token with its API key, and
 * the CORS preflights for `/v1/*`. The tokens themselves are accounts/browser-token.ts.
 * See docs/edge.md, "Browser tokens and CORS".
 */
import { Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { z } from "zod";
import type { Limits } from "../../durable-objects/key-account/types.ts";
import { ApiError, invalidApiKey } from "../../contracts/errors.ts";
import {
  CORS_MAX_AGE_SECONDS,
  DEFAULT_TOKEN_TTL_SECONDS,
  LimitsClaim,
  MAX_TOKEN_TTL_SECONDS,
  mintBrowserToken,
  originAllowedByAnyKey,
} from "../accounts/browser-token.ts";
import { authenticateBearer, refusalError } from "../accounts/account-client.ts";
import { checkKeyModels } from "../accounts/key-models.ts";
import { apiKeyOnly } from "../middleware/api-key-only.ts";
import { readJsonBody } from "../request/json-body.ts";
import { BudgetList, budgetJson, periodBudgetsOf } from "./admin/key-payloads.ts";
import { methodNotAllowed } from "../error-handler.ts";

const TokenRequest = z.strictObject({
  user: z.string().min(1).max(256).optional(),
  ttl_seconds: z.int().min(1).max(MAX_TOKEN_TTL_SECONDS).optional(),
  limits: LimitsClaim.partial().optional(),
  models: z.array(z.string().min(1).max(256)).max(256).optional(),
  /** The end user's own budgets (`period`, `max_usd`), within the key's. */
  budgets: BudgetList.optional(),
});

/** `POST /v1/tokens` (mint with an API key) and CORS preflights for `/v1/*`; mount at `/v1`. */
export const tokens = new Hono<AppEnv>()
  .options("/*", async (c) => {
    const origin = c.req.header("origin");
    if (
      origin === undefined ||
      !(await originAllowedByAnyKey(c.env, origin, Date.now(), c.var.edge.browserTokens))
    ) {
      // No CORS headers at all: the browser refuses the actual request.
      throw new ApiError(403, "This origin is not allowed.", {
        type: "invalid_request_error",
        code: "origin_not_allowed",
      });
    }
    const requested = c.req.header("access-control-request-headers");
    return c.body(null, 204, {
      "access-control-allow-origin": origin,
      "access-control-allow-methods": "GET, POST, OPTIONS",
      "access-control-allow-headers":
        requested !== undefined && /^[\w\-, ]*$/.test(requested)
          ? requested
          : "authorization, content-type",
      "access-control-max-age": String(CORS_MAX_AGE_SECONDS),
      vary: "Origin, Access-Control-Request-Headers",
    });
  })
  .post("/tokens", async (c) => {
    const now = Date.now();
    // Only an API key mints tokens; a valid browser token is told it is one (403), as on the
    // key's other own routes, and anything else is a wrong key.
    const auth = await authenticateBearer(c.env, c.req.header("authorization"), {
      now,
      apiKeys: c.var.edge.apiKeys,
      browserTokens: c.var.edge.browserTokens,
    });
    if (!auth.ok) throw invalidApiKey();
    const apiKey = apiKeyOnly(auth, "mint browser tokens");
    const requested = await readJsonBody(c.req.raw, TokenRequest);
    const account = c.env.KEY_ACCOUNT.get(c.env.KEY_ACCOUNT.idFromName(apiKey.keyId));
    const check = await account.check({
      credential: { kind: "key", secretHash: apiKey.secretHash },
      now,
    });
    if (!check.ok) throw refusalError(check, apiKey.keyId);
    const { record } = check;
    if (requested.models) checkKeyModels(c.env.WARMGATE_CONFIG, requested.models);
    const outside = (requested.models ?? []).find(
      (model) => check.models !== null && !check.models.includes(model),
    );
    if (outside !== undefined) {
      throw new ApiError(400, `The key may not use the model \`${outside}\`.`, {
        type: "invalid_request_error",
        code: "model_not_allowed",
        param: "models",
      });
    }
    // Never wider than the key: each limit is at most the key's.
    const limits: Limits = {
      rpm: Math.min(requested.limits?.rpm ?? record.limits.rpm, record.limits.rpm),
      tpm: Math.min(requested.limits?.tpm ?? record.limits.tpm, record.limits.tpm),
      concurrency: Math.min(
        requested.limits?.concurrency ?? record.limits.concurrency,
        record.limits.concurrency,
      ),
    };
    const models = requested.models ?? record.models;
    const user = requested.user ?? null;
    // An end user's budgets alert no one: only their limits are kept.
    const budgets = periodBudgetsOf(requested.budgets ?? []).map((budget) => ({
      ...budget,
      softMicros: null,
    }));
    const { token, expiresAt } = await mintBrowserToken(
      c.env,
      {
        keyId: apiKey.keyId,
        secretGeneration: check.secretGeneration,
        user,
        limits,
        models,
        origins: record.allowedOrigins,
        budgets,
        ttlSeconds: requested.ttl_seconds ?? DEFAULT_TOKEN_TTL_SECONDS,
        now,
      },
      c.var.edge.browserTokens,
    );
    return c.json({
      object: "browser_token",
      token,
      expires_at: expiresAt,
      user,
      limits,
      models,
      budgets: budgets.map(budgetJson),
    });
  })
  .all("/tokens", methodNotAllowed(["POST"]));
