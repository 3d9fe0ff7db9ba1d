/**
 * The admin key API's payloads: the zod schemas of the create, update and rotate bodies,
 * their limits and budgets in the KeyAccount's terms, and a key as the API shows it (unix
 * seconds, US dollars).
 * See docs/edge.md.
 */
import { z } from "zod";
import { MAX_KEY_TAGS, TAG_PATTERN } from "../../../contracts/tags.ts";
import {
  KEY_TIERS,
  type Budgets,
  type KeyRecord,
  type Limits,
} from "../../../durable-objects/key-account/types.ts";
import { microsToUsd, usdToMicros } from "../../../contracts/pricing.ts";
import { TEAM_ID_PATTERN } from "../../accounts/teams.ts";

/** Limits of a key when the create request names none. */
export const DEFAULT_KEY_LIMITS = { rpm: 600, tpm: 1_000_000, concurrency: 64 } as const;

/** Grace period of the previous secret after a rotation when the request names none. */
export const DEFAULT_ROTATION_GRACE_SECONDS = 3_600;

const MAX_ROTATION_GRACE_SECONDS = 7 * 86_400;

// US dollars, exact to the micro-dollar (see contracts/pricing.ts).
const Usd = z.number().refine((amount) => usdToMicros(amount) !== null, {
  message: "Expected US dollars from 0 to 1e9 with at most six decimal places.",
});

/** Limits and budgets of a key or a team: requests, tokens, concurrency and US dollars. */
export const KeyLimits = z.strictObject({
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

export function rateLimitsOf(limits: KeyLimitsBody): Partial<Limits> {
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

/** Micro-dollars in US dollars (null stays null). */
export function usd(amount: number | null): number | null {
  return amount === null ? null : microsToUsd(amount);
}

export function budgetsOf(limits: KeyLimitsBody): Partial<Budgets> {
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

/** A tag: 1 to 64 letters, digits or `_ . : = / @ + -`. */
export const Tag = z.string().regex(TAG_PATTERN, {
  message: "Expected a tag of 1 to 64 letters, digits or _ . : = / @ + -.",
});

/** Free metadata: at most 32 entries of scalars, names and strings bounded. */
export const Metadata = z
  .record(
    z.string().min(1).max(64),
    z.union([z.string().max(512), z.number(), z.boolean(), z.null()]),
  )
  .refine((value) => Object.keys(value).length <= 32, {
    message: "Expected at most 32 metadata entries.",
  });

const KeyFields = {
  name: z.string().trim().min(1).max(200),
  limits: KeyLimits.partial(),
  allowed_origins: z.array(BrowserOrigin).max(100),
  models: z.array(z.string().min(1).max(256)).max(1_000).nullable(),
  tier: z.enum(KEY_TIERS),
  allow_region_override: z.boolean(),
  expires_at: ExpiresAt.nullable(),
  tags: z.array(Tag).max(MAX_KEY_TAGS),
  metadata: Metadata,
  /** The team the key belongs to (it must exist), or null for none. */
  team_id: z.string().regex(TEAM_ID_PATTERN, { message: "Expected a team id." }).nullable(),
};

/** `blocked` is changed with `PATCH` (or the block and unblock routes), not set at creation. */
const UpdateOnlyFields = { blocked: z.boolean() };

/** Body of `POST /admin/keys`: all but `name` optional. */
export const CreateKeyRequest = z.strictObject(KeyFields).partial().required({ name: true });

/** Body of `PATCH /admin/keys/{id}`: any subset of the create fields. */
export const UpdateKeyRequest = z.strictObject({ ...KeyFields, ...UpdateOnlyFields }).partial();

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
    blocked_at: seconds(record.blockedAt),
    tags: record.tags,
    metadata: record.metadata,
    team_id: record.teamId,
    previous_key_expires_at: seconds(record.previousSecretValidUntil),
  };
}

function isOrigin(value: string): boolean {
  try {
    const url = new URL(value);
    return (url.protocol === "https:" || url.protocol === "http:") && url.origin === value;
  } catch {
    return false;
  }
}

/** Epoch ms in unix seconds (null stays null). */
export function seconds(ms: number | null): number | null {
  return ms === null ? null : Math.floor(ms / 1_000);
}
