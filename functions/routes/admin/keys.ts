// The admin API for API keys, mounted at `/admin`, behind `Authorization: Bearer
// <ADMIN_TOKEN>`. Each key's KeyAccount is its source of truth; every change is then
// copied to the KeyDirectory (versioned, so copies never go backwards), which answers
// listing, and records each change in the audit log. A key's secret appears only in the
// answers to create and rotate. The bodies and the key's JSON form are key-payloads.ts;
// the admin token check is middleware/admin-auth.ts.
// See docs/edge.md.

import type { AppEnv } from "../../app-env.ts";
import { Hono } from "hono";
import { ApiError, invalidRequest, notFound } from "../../../contracts/errors.ts";
import { readJsonBody } from "../../request/json-body.ts";
import { methodNotAllowed } from "../../error-handler.ts";
import { checkKeyModels } from "../../accounts/key-models.ts";
import { keyAccount, keyDirectory } from "../../accounts/account-client.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import {
  CreateKeyRequest,
  DEFAULT_KEY_LIMITS,
  DEFAULT_ROTATION_GRACE_SECONDS,
  RotateKeyRequest,
  UpdateKeyRequest,
  budgetStatusJson,
  budgetsOf,
  keyJson,
  modelLimitsOf,
  rateLimitsOf,
} from "./key-payloads.ts";
import { KEY_ID_PATTERN, mintApiKey, newKeyId } from "../../accounts/keys.ts";
import { auditEntry } from "../../accounts/audit.ts";
import { noSuchTeam } from "../../accounts/teams.ts";
import { teamKnown } from "./teams.ts";
import type { Context } from "hono";

/**
 * `/admin/keys…`: create, list, get, update, block, unblock, revoke and rotate API keys.
 */
export const adminKeys = new Hono<{ Bindings: Env; Variables: Pick<AppEnv["Variables"], "edge"> }>()
  .use("*", adminAuth())
  .post("/keys", async (c) => {
    const body = await readJsonBody(c.req.raw, CreateKeyRequest);
    if (body.models) checkKeyModels(c.env.WARMGATE_CONFIG, body.models);
    await checkTeam(c.env, body.team_id);
    if (body.model_limits) checkModelLimits(c.env.WARMGATE_CONFIG, body.model_limits);
    const now = Date.now();
    refusePastExpiry(body.expires_at, now, "the key would never work");
    const id = newKeyId();
    const { key, secretHash } = await mintApiKey(c.env, id);
    const record = await keyAccount(c.env, id).create({
      id,
      name: body.name,
      secretHash,
      limits: { ...DEFAULT_KEY_LIMITS, ...rateLimitsOf(body.limits ?? {}) },
      budgets: { periods: [], creditMicros: null, ...budgetsOf(body.limits, body.budgets) },
      modelLimits: modelLimitsOf(body.model_limits ?? {}),
      alertWebhookUrl: body.alert_webhook_url ?? null,
      allowedOrigins: body.allowed_origins ?? [],
      models: body.models ?? null,
      tier: body.tier ?? "standard",
      allowRegionOverride: body.allow_region_override ?? false,
      expiresAt: body.expires_at ?? null,
      tags: [...new Set(body.tags ?? [])],
      metadata: body.metadata ?? {},
      teamId: body.team_id ?? null,
      now,
    });
    if (record === null) throw new Error("key id already in use");
    await keyDirectory(c.env).upsert(record, await auditEntry(c, "key.create", target(id), body));
    return c.json({ ...keyJson(record), key }, 201);
  })
  .get("/keys", async (c) => {
    const limit = Number(c.req.query("limit") ?? "20");
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
      throw new ApiError(400, "limit must be an integer from 1 to 100.", {
        type: "invalid_request_error",
        param: "limit",
      });
    }
    const page = await keyDirectory(c.env).list({ limit, after: c.req.query("after") ?? null });
    const data = page.keys.map(keyJson);
    return c.json({
      object: "list",
      data,
      first_id: page.keys[0]?.id ?? null,
      last_id: page.keys.at(-1)?.id ?? null,
      has_more: page.hasMore,
    });
  })
  .get("/keys/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const account = keyAccount(c.env, id);
    const [record, status] = await Promise.all([account.get(), account.budgetStatus()]);
    if (record === null) throw noSuchKey(id);
    return c.json({ ...keyJson(record), budget_status: budgetStatusJson(status) });
  })
  .patch("/keys/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const body = await readJsonBody(c.req.raw, UpdateKeyRequest);
    const { name, limits, allowed_origins, models, tier, expires_at, blocked, metadata } = body;
    if (models) checkKeyModels(c.env.WARMGATE_CONFIG, models);
    await checkTeam(c.env, body.team_id);
    if (body.model_limits) checkModelLimits(c.env.WARMGATE_CONFIG, body.model_limits);
    const now = Date.now();
    refusePastExpiry(expires_at, now, "the key would stop working at once (block or revoke it)");
    await refuseIfRevoked(c.env, id, blocked === undefined ? "changed" : "blocked or unblocked");
    const override = body.allow_region_override;
    const record = await keyAccount(c.env, id).update({
      now,
      ...(name === undefined ? {} : { name }),
      ...(limits === undefined ? {} : { limits: rateLimitsOf(limits) }),
      budgets: budgetsOf(limits, body.budgets),
      ...(body.model_limits === undefined ? {} : { modelLimits: modelLimitsOf(body.model_limits) }),
      ...(body.alert_webhook_url === undefined ? {} : { alertWebhookUrl: body.alert_webhook_url }),
      ...(allowed_origins === undefined ? {} : { allowedOrigins: allowed_origins }),
      ...(models === undefined ? {} : { models }),
      ...(tier === undefined ? {} : { tier }),
      ...(override === undefined ? {} : { allowRegionOverride: override }),
      ...(expires_at === undefined ? {} : { expiresAt: expires_at }),
      ...(blocked === undefined ? {} : { blocked }),
      ...(body.tags === undefined ? {} : { tags: [...new Set(body.tags)] }),
      ...(metadata === undefined ? {} : { metadata }),
      ...(body.team_id === undefined ? {} : { teamId: body.team_id }),
    });
    if (record === null) throw noSuchKey(id);
    // This isolate's lease of the key ends now; every other one within its window.
    c.var.edge.leases.drop(id);
    await keyDirectory(c.env).upsert(record, await auditEntry(c, "key.update", target(id), body));
    return c.json(keyJson(record));
  })
  .post("/keys/:id/block", (c) => setBlocked(c, true))
  .post("/keys/:id/unblock", (c) => setBlocked(c, false))
  .delete("/keys/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const record = await keyAccount(c.env, id).revoke(Date.now());
    if (record === null) throw noSuchKey(id);
    // This isolate's lease of the key ends now; every other one within its window.
    c.var.edge.leases.drop(id);
    await keyDirectory(c.env).upsert(record, await auditEntry(c, "key.revoke", target(id)));
    return c.json(keyJson(record));
  })
  .post("/keys/:id/rotate", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const body = await readJsonBody(c.req.raw, RotateKeyRequest);
    const { key, secretHash } = await mintApiKey(c.env, id);
    const graceSeconds = body.grace_seconds ?? DEFAULT_ROTATION_GRACE_SECONDS;
    const record = await keyAccount(c.env, id).rotate({
      secretHash,
      graceMs: graceSeconds * 1_000,
      now: Date.now(),
    });
    if (record === null) throw keyRevoked("rotated");
    c.var.edge.leases.drop(id);
    const audit = await auditEntry(c, "key.rotate", target(id), { grace_seconds: graceSeconds });
    await keyDirectory(c.env).upsert(record, audit);
    return c.json({ ...keyJson(record), key });
  })
  .all("/keys", methodNotAllowed(["GET", "HEAD", "POST"]))
  .all("/keys/:id", methodNotAllowed(["GET", "HEAD", "PATCH", "DELETE"]))
  .all("/keys/:id/:action{block|unblock|rotate}", methodNotAllowed(["POST"]));

type AdminContext = Context<{ Bindings: Env; Variables: Pick<AppEnv["Variables"], "edge"> }>;

// `POST /admin/keys/{id}/block` and `/unblock`: the key's requests are refused (403
// `key_blocked`) or admitted again; its leases end as for any change (docs/key-account.md).
async function setBlocked(c: AdminContext, blocked: boolean): Promise<Response> {
  const id = c.req.param("id") ?? "";
  if (!(await known(c.env, id))) throw noSuchKey(id);
  await refuseIfRevoked(c.env, id, "blocked or unblocked");
  const record = await keyAccount(c.env, id).update({ blocked, now: Date.now() });
  if (record === null) throw noSuchKey(id);
  c.var.edge.leases.drop(id);
  const action = blocked ? "key.block" : "key.unblock";
  await keyDirectory(c.env).upsert(record, await auditEntry(c, action, target(id)));
  return c.json(keyJson(record));
}

// A key's `team_id` must name a team that exists.
async function checkTeam(env: Env, teamId: string | null | undefined): Promise<void> {
  if (teamId === null || teamId === undefined) return;
  if (!(await teamKnown(env, teamId))) throw noSuchTeam(teamId, "team_id");
}

async function refuseIfRevoked(env: Env, id: string, what: string): Promise<void> {
  const current = await keyAccount(env, id).get();
  if (current?.status === "revoked") throw keyRevoked(what);
}

function keyRevoked(what: string): ApiError {
  return new ApiError(409, `A revoked key cannot be ${what}.`, {
    type: "invalid_request_error",
    code: "key_revoked",
    param: "id",
  });
}

// Per-model limits name models the gateway serves, as a key's allowlist does.
function checkModelLimits(configText: string | undefined, limits: Record<string, unknown>): void {
  const names = Object.keys(limits);
  checkKeyModels(configText, names, (i) => `model_limits.${names[i] ?? ""}`);
}

function target(id: string): { type: string; id: string } {
  return { type: "key", id };
}

/** Whether a key id is indexed: only those are looked up, so probing never creates a KeyAccount. */
export async function known(env: Env, id: string): Promise<boolean> {
  return KEY_ID_PATTERN.test(id) && (await keyDirectory(env).has(id));
}

/** The 404 of an unknown (or malformed) key id. */
export function noSuchKey(id: string): ApiError {
  const shown = KEY_ID_PATTERN.test(id) ? id : "(malformed id)";
  return notFound(`No API key with id ${shown}.`, "key_not_found", "id");
}

// An expiry already past is a mistake (seconds read as milliseconds, a wrong year): 400.
function refusePastExpiry(expiresAt: number | null | undefined, now: number, why: string): void {
  if (expiresAt === undefined || expiresAt === null || expiresAt > now) return;
  throw invalidRequest(`expires_at is in the past: ${why}.`, "expires_at", "invalid_value");
}
