// The admin API for API keys, mounted at `/admin`, behind `Authorization: Bearer
// <ADMIN_TOKEN>`. Each key's KeyAccount is its source of truth; every change is then
// copied to the KeyDirectory (versioned, so copies never go backwards), which answers
// listing. A key's secret appears only in the answers to create and rotate. Also
// `/admin/usage`, the usage API across keys. The bodies and the key's JSON form are
// key-payloads.ts; the admin token check is middleware/admin-auth.ts.
// See docs/edge.md.

import type { AppEnv } from "../../app-env.ts";
import { Hono } from "hono";
import { NO_BUDGETS, type UsageRow } from "../../../durable-objects/key-account/types.ts";
import { ApiError, notFound } from "../../../contracts/errors.ts";
import { readJsonBody } from "../../request/json-body.ts";
import { checkKeyModels } from "../../accounts/key-models.ts";
import { keyAccount, keyDirectory } from "../../accounts/account-client.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import {
  CreateKeyRequest,
  DEFAULT_KEY_LIMITS,
  DEFAULT_ROTATION_GRACE_SECONDS,
  RotateKeyRequest,
  UpdateKeyRequest,
  budgetsOf,
  keyJson,
  rateLimitsOf,
} from "./key-payloads.ts";
import { onlyParams, sumUsage, totalsJson, usageRange, usageReport, usageUser } from "../usage.ts";
import { KEY_ID_PATTERN, mintApiKey, newKeyId } from "../../accounts/keys.ts";

/** Key accounts asked at once by `GET /admin/usage`. */
export const USAGE_FAN_OUT = 32;

/**
 * `/admin/keys…`: create, list, get, update, revoke and rotate API keys;
 * `/admin/usage`: the usage API across keys.
 */
export const adminKeys = new Hono<{ Bindings: Env; Variables: Pick<AppEnv["Variables"], "edge"> }>()
  .use("*", adminAuth())
  .get("/usage", async (c) => {
    onlyParams(c.req.query(), ["from", "to", "key_id", "user"]);
    const range = usageRange(c.req.query("from"), c.req.query("to"), Date.now());
    const user = usageUser(c.req.query("user"));
    const only = c.req.query("key_id");
    const all: { id: string; name: string }[] = await keyDirectory(c.env).ids();
    const keys = only === undefined ? all : all.filter((key) => key.id === only);
    if (only !== undefined && keys.length === 0) throw noSuchKey(only);
    // Each key's account holds its own ledger (and its end users' requests): ask them all,
    // a batch at a time.
    const perKey: { id: string; name: string; rows: UsageRow[] }[] = [];
    for (let i = 0; i < keys.length; i += USAGE_FAN_OUT) {
      const batch = keys.slice(i, i + USAGE_FAN_OUT);
      const answers = await Promise.all(
        batch.map((key) =>
          keyAccount(c.env, key.id).usage({ ...range, ...(user !== undefined && { user }) }),
        ),
      );
      answers.forEach((answer, j) => {
        const key = batch[j];
        if (answer.ok && key !== undefined) perKey.push({ ...key, rows: answer.rows });
      });
    }
    const merged = new Map<string, UsageRow>();
    for (const row of perKey.flatMap((key) => key.rows)) {
      const slot = `${row.day}\u0000${row.model}`;
      const seen = merged.get(slot);
      merged.set(slot, seen === undefined ? { ...row } : { ...seen, ...sumUsage([seen, row]) });
    }
    const rows = [...merged.values()].sort((a, b) =>
      a.day === b.day ? a.model.localeCompare(b.model) : a.day.localeCompare(b.day),
    );
    return c.json({
      ...usageReport(range, rows),
      user: user ?? null,
      keys: perKey
        .map((key) => ({ key_id: key.id, name: key.name, ...totalsJson(sumUsage(key.rows)) }))
        .filter((key) => key.requests > 0),
    });
  })
  .post("/keys", async (c) => {
    const body = await readJsonBody(c.req.raw, CreateKeyRequest);
    if (body.models) checkKeyModels(c.env.WARMGATE_CONFIG, body.models);
    const now = Date.now();
    const id = newKeyId();
    const { key, secretHash } = await mintApiKey(c.env, id);
    const record = await keyAccount(c.env, id).create({
      id,
      name: body.name,
      secretHash,
      limits: { ...DEFAULT_KEY_LIMITS, ...rateLimitsOf(body.limits ?? {}) },
      budgets: { ...NO_BUDGETS, ...budgetsOf(body.limits ?? {}) },
      allowedOrigins: body.allowed_origins ?? [],
      models: body.models ?? null,
      tier: body.tier ?? "standard",
      allowRegionOverride: body.allow_region_override ?? false,
      expiresAt: body.expires_at ?? null,
      now,
    });
    if (record === null) throw new Error("key id already in use");
    await keyDirectory(c.env).upsert(record);
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
    const record = await keyAccount(c.env, id).get();
    if (record === null) throw noSuchKey(id);
    return c.json(keyJson(record));
  })
  .patch("/keys/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const body = await readJsonBody(c.req.raw, UpdateKeyRequest);
    const { name, limits, allowed_origins, models, tier, expires_at } = body;
    if (models) checkKeyModels(c.env.WARMGATE_CONFIG, models);
    const override = body.allow_region_override;
    const record = await keyAccount(c.env, id).update({
      now: Date.now(),
      ...(name === undefined ? {} : { name }),
      ...(limits === undefined ? {} : { limits: rateLimitsOf(limits), budgets: budgetsOf(limits) }),
      ...(allowed_origins === undefined ? {} : { allowedOrigins: allowed_origins }),
      ...(models === undefined ? {} : { models }),
      ...(tier === undefined ? {} : { tier }),
      ...(override === undefined ? {} : { allowRegionOverride: override }),
      ...(expires_at === undefined ? {} : { expiresAt: expires_at }),
    });
    if (record === null) throw noSuchKey(id);
    // This isolate's lease of the key ends now; every other one within its window.
    c.var.edge.leases.drop(id);
    await keyDirectory(c.env).upsert(record);
    return c.json(keyJson(record));
  })
  .delete("/keys/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const record = await keyAccount(c.env, id).revoke(Date.now());
    if (record === null) throw noSuchKey(id);
    // This isolate's lease of the key ends now; every other one within its window.
    c.var.edge.leases.drop(id);
    await keyDirectory(c.env).upsert(record);
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
    if (record === null) {
      throw new ApiError(409, "A revoked key cannot be rotated.", {
        type: "invalid_request_error",
        code: "key_revoked",
        param: "id",
      });
    }
    c.var.edge.leases.drop(id);
    await keyDirectory(c.env).upsert(record);
    return c.json({ ...keyJson(record), key });
  });

/** Whether a key id is indexed: only those are looked up, so probing never creates a KeyAccount. */
export async function known(env: Env, id: string): Promise<boolean> {
  return KEY_ID_PATTERN.test(id) && (await keyDirectory(env).has(id));
}

/** The 404 for a key id that names no key (a malformed one is not echoed). */
export function noSuchKey(id: string): ApiError {
  const shown = KEY_ID_PATTERN.test(id) ? id : "(malformed id)";
  return notFound(`No API key with id ${shown}.`, "key_not_found", "id");
}
