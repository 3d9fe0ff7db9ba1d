// The admin API for API keys, mounted at `/admin`, behind `Authorization: Bearer
// <ADMIN_TOKEN>`. Each key's KeyAccount is its source of truth; every change is then
// copied to the KeyDirectory (versioned, so copies never go backwards), which answers
// listing. A key's secret appears only in the answers to create and rotate.
// See docs/edge.md.

import { Hono } from "hono";
import { z } from "zod";
import {
  KEY_TIERS,
  NO_BUDGETS,
  type Budgets,
  type KeyRecord,
  type Limits,
  type UsageRow,
} from "../../../durable-objects/key-account/types.ts";
import { microsToUsd, usdToMicros } from "../../../contracts/pricing.ts";
import { ApiError, notFound } from "../../../contracts/errors.ts";
import { readJsonBody } from "../../request/json-body.ts";
import { checkKeyModels } from "../../accounts/key-models.ts";
import { keyAccount, keyDirectory } from "../../accounts/account-client.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import { sumUsage, totalsJson, usageRange, usageReport } from "../usage.ts";
import { KEY_ID_PATTERN, mintApiKey, newKeyId } from "../../accounts/keys.ts";

/** Limits of a key when the create request names none. */
export const DEFAULT_KEY_LIMITS = { rpm: 600, tpm: 1_000_000, concurrency: 64 } as const;

/** Grace period of the previous secret after a rotation when the request names none. */
export const DEFAULT_ROTATION_GRACE_SECONDS = 3_600;

const MAX_ROTATION_GRACE_SECONDS = 7 * 86_400;

// US dollars, exact to the micro-dollar (see contracts/pricing.ts).
const Usd = z.number().refine((amount) => usdToMicros(amount) !== null, {
  message: "Expected US dollars from 0 to 1e9 with at most six decimal places.",
});

const KeyLimits = z.strictObject({
  rpm: z.int().min(1).max(1_000_000_000),
  tpm: z.int().min(1).max(1_000_000_000_000),
  concurrency: z.int().min(1).max(1_000_000),
  /** Spending per UTC day; null removes it. */
  budget_usd_day: Usd.nullable(),
  /** Spending per UTC month; null removes it. */
  budget_usd_month: Usd.nullable(),
  /** Spending over the key's lifetime; null removes it. */
  credit_usd: Usd.nullable(),
});

type KeyLimitsBody = Partial<z.infer<typeof KeyLimits>>;

function rateLimitsOf(limits: KeyLimitsBody): Partial<Limits> {
  const { rpm, tpm, concurrency } = limits;
  return {
    ...(rpm === undefined ? {} : { rpm }),
    ...(tpm === undefined ? {} : { tpm }),
    ...(concurrency === undefined ? {} : { concurrency }),
  };
}

function micros(dollars: number | null): number | null {
  return dollars === null ? null : usdToMicros(dollars);
}

function usd(amount: number | null): number | null {
  return amount === null ? null : microsToUsd(amount);
}

function budgetsOf(limits: KeyLimitsBody): Partial<Budgets> {
  return {
    ...(limits.budget_usd_day === undefined ? {} : { dayMicros: micros(limits.budget_usd_day) }),
    ...(limits.budget_usd_month === undefined
      ? {}
      : { monthMicros: micros(limits.budget_usd_month) }),
    ...(limits.credit_usd === undefined ? {} : { creditMicros: micros(limits.credit_usd) }),
  };
}

const BrowserOrigin = z
  .string()
  .max(512)
  .refine(isOrigin, { message: "Expected an origin such as https://app.example.com." });

// Unix seconds (OpenAI's timestamps) or an ISO 8601 date-time; stored as epoch ms.
const ExpiresAt = z
  .union([z.int().positive(), z.iso.datetime({ offset: true })])
  .transform((value) => (typeof value === "number" ? value * 1_000 : Date.parse(value)));

const KeyFields = {
  name: z.string().trim().min(1).max(200),
  limits: KeyLimits.partial(),
  allowed_origins: z.array(BrowserOrigin).max(100),
  models: z.array(z.string().min(1).max(256)).max(1_000).nullable(),
  tier: z.enum(KEY_TIERS),
  allow_region_override: z.boolean(),
  expires_at: ExpiresAt.nullable(),
};

/** Body of `POST /admin/keys`: all but `name` optional. */
export const CreateKeyRequest = z.strictObject(KeyFields).partial().required({ name: true });

/** Body of `PATCH /admin/keys/{id}`: any subset of the create fields. */
export const UpdateKeyRequest = z.strictObject(KeyFields).partial();

/** Body of `POST /admin/keys/{id}/rotate`. */
export const RotateKeyRequest = z.strictObject({
  grace_seconds: z.int().min(0).max(MAX_ROTATION_GRACE_SECONDS).optional(),
});

/** A key as the admin API shows it; times in unix seconds, money in US dollars. */
export function keyJson(record: KeyRecord): Record<string, unknown> {
  const { budgets } = record;
  return {
    id: record.id,
    object: "api_key",
    name: record.name,
    status: record.status,
    limits: {
      ...record.limits,
      budget_usd_day: usd(budgets.dayMicros),
      budget_usd_month: usd(budgets.monthMicros),
      credit_usd: usd(budgets.creditMicros),
    },
    allowed_origins: record.allowedOrigins,
    models: record.models,
    tier: record.tier,
    allow_region_override: record.allowRegionOverride,
    expires_at: seconds(record.expiresAt),
    created_at: seconds(record.createdAt),
    updated_at: seconds(record.updatedAt),
    revoked_at: seconds(record.revokedAt),
    previous_key_expires_at: seconds(record.previousSecretValidUntil),
  };
}

/** Key accounts asked at once by `GET /admin/usage`. */
export const USAGE_FAN_OUT = 32;

/**
 * `/admin/keys…`: create, list, get, update, revoke and rotate API keys;
 * `/admin/usage`: the usage API across keys.
 */
export const adminApp = new Hono<{ Bindings: Env }>()
  .use("*", adminAuth())
  .get("/usage", async (c) => {
    const range = usageRange(c.req.query("from"), c.req.query("to"), Date.now());
    const only = c.req.query("key_id");
    let keys = await keyDirectory(c.env).ids();
    if (only !== undefined) {
      keys = keys.filter((key) => key.id === only);
      if (keys.length === 0) throw noSuchKey(only);
    }
    // Each key's account holds its own ledger: ask them all, a batch at a time.
    const perKey: { id: string; name: string; rows: UsageRow[] }[] = [];
    for (let i = 0; i < keys.length; i += USAGE_FAN_OUT) {
      const batch = keys.slice(i, i + USAGE_FAN_OUT);
      const answers = await Promise.all(batch.map((key) => keyAccount(c.env, key.id).usage(range)));
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
    await keyDirectory(c.env).upsert(record);
    return c.json(keyJson(record));
  })
  .delete("/keys/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const record = await keyAccount(c.env, id).revoke(Date.now());
    if (record === null) throw noSuchKey(id);
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
    await keyDirectory(c.env).upsert(record);
    return c.json({ ...keyJson(record), key });
  });

// Only indexed keys are looked up, so probing ids never creates a KeyAccount.
async function known(env: Env, id: string): Promise<boolean> {
  return KEY_ID_PATTERN.test(id) && (await keyDirectory(env).has(id));
}

function noSuchKey(id: string): ApiError {
  const shown = KEY_ID_PATTERN.test(id) ? id : "(malformed id)";
  return notFound(`No API key with id ${shown}.`, "key_not_found", "id");
}

function isOrigin(value: string): boolean {
  try {
    const url = new URL(value);
    return (url.protocol === "https:" || url.protocol === "http:") && url.origin === value;
  } catch {
    return false;
  }
}

function seconds(ms: number | null): number | null {
  return ms === null ? null : Math.floor(ms / 1_000);
}
