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
  type KeyRecord,
  type Limits,
} from "../../../durable-objects/key-account/types.ts";
import {
  type BudgetStatus,
  type Budgets,
  type ModelLimits,
  type PeriodBudget,
} from "../../../durable-objects/key-account/budget-types.ts";
import { isBudgetPeriod } from "../../../contracts/budget-periods.ts";
import { microsToUsd, picosToUsd, usdToMicros } from "../../../contracts/pricing.ts";
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
  /** Spending over the key's lifetime; null removes it. */
  credit_usd: Usd.nullable(),
});

/** Most budgets a key (or an end user's token) has. */
export const MAX_BUDGETS = 8;

/**
 * A budget over a period (`1h`, `1d`, `7d`, `30d`, `month`, any `<n>h` up to 744 or `<n>d`
 * up to 31): `max_usd` refuses, `soft_usd` (below it) alerts.
 */
const BudgetBody = z
  .strictObject({
    period: z.string().refine(isBudgetPeriod, {
      message: "Expected a period such as 1h, 1d, 7d, 30d (at most 31 days) or month.",
    }),
    max_usd: Usd,
    soft_usd: Usd.nullable().optional(),
  })
  .refine((budget) => budget.soft_usd == null || budget.soft_usd < budget.max_usd, {
    message: "Expected soft_usd below max_usd.",
    path: ["soft_usd"],
  });

/** A list of budgets, each period at most once. */
export const BudgetList = z
  .array(BudgetBody)
  .max(MAX_BUDGETS)
  .refine((list) => new Set(list.map((budget) => budget.period)).size === list.length, {
    message: "Expected each period at most once.",
  });

/** Budgets as the KeyAccount keeps them, in micro-dollars. */
export function periodBudgetsOf(list: z.infer<typeof BudgetList>): PeriodBudget[] {
  return list.map((budget) => ({
    period: budget.period,
    limitMicros: usdToMicros(budget.max_usd) ?? 0,
    softMicros: budget.soft_usd == null ? null : usdToMicros(budget.soft_usd),
  }));
}

/** A budget as the admin API shows it. */
export function budgetJson(budget: PeriodBudget): Record<string, unknown> {
  return {
    period: budget.period,
    max_usd: microsToUsd(budget.limitMicros),
    soft_usd: usd(budget.softMicros),
  };
}

/**
 * The budgets as they stand (GET /admin/keys/{id}, the usage APIs): each window's spend,
 * what requests in flight hold, and when it resets (unix seconds; null for the credit).
 */
export function budgetStatusJson(status: readonly BudgetStatus[]): Record<string, unknown>[] {
  return status.map((one) => ({
    period: one.budget,
    max_usd: picosToUsd(one.limitPicos),
    soft_usd: one.softPicos === null ? null : picosToUsd(one.softPicos),
    spent_usd: picosToUsd(one.spentPicos),
    reserved_usd: picosToUsd(one.reservedPicos),
    window_start: seconds(one.startsAt),
    resets_at: seconds(one.resetsAt),
  }));
}

// Per-model limits within the key's: at least one of rpm and tpm; null removes one.
const ModelLimitsBody = z
  .record(
    z.string().min(1).max(256),
    z
      .strictObject({
        rpm: z.int().min(1).max(1_000_000_000).nullable().optional(),
        tpm: z.int().min(1).max(1_000_000_000_000).nullable().optional(),
      })
      .refine((limits) => limits.rpm != null || limits.tpm != null, {
        message: "Expected rpm, tpm or both.",
      }),
  )
  .refine((value) => Object.keys(value).length <= 64, {
    message: "Expected limits for at most 64 models.",
  });

/** Per-model limits as the KeyAccount keeps them. */
export function modelLimitsOf(body: z.infer<typeof ModelLimitsBody>): Record<string, ModelLimits> {
  return Object.fromEntries(
    Object.entries(body).map(([model, limits]) => [
      model,
      { rpm: limits.rpm ?? null, tpm: limits.tpm ?? null },
    ]),
  );
}

/** Where soft-budget alerts go: https (http only for a loopback address, for local runs). */
export const WebhookUrl = z
  .url({ protocol: /^https?$/ })
  .max(2_048)
  .refine((url) => url.startsWith("https:") || isLoopback(url), {
    message: "Expected an https URL (http only for localhost).",
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

/** The budgets a create or update body changes: its period list, its credit. */
export function budgetsOf(
  limits: KeyLimitsBody | undefined,
  budgets: z.infer<typeof BudgetList> | undefined,
): Partial<Budgets> {
  return {
    ...(budgets === undefined ? {} : { periods: periodBudgetsOf(budgets) }),
    ...(limits?.credit_usd === undefined ? {} : { creditMicros: micros(limits.credit_usd) }),
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
  budgets: BudgetList,
  model_limits: ModelLimitsBody,
  alert_webhook_url: WebhookUrl.nullable(),
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
    limits: { ...record.limits, credit_usd: usd(budgets.creditMicros) },
    budgets: budgets.periods.map(budgetJson),
    model_limits: record.modelLimits,
    alert_webhook_url: record.alertWebhookUrl,
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

function isLoopback(value: string): boolean {
  const host = new URL(value).hostname;
  return host === "localhost" || host === "127.0.0.1" || host === "[::1]";
}

/** Epoch ms in unix seconds (null stays null). */
export function seconds(ms: number | null): number | null {
  return ms === null ? null : Math.floor(ms / 1_000);
}
