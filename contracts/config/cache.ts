/**
 * The `cache` section of `WARMGATE_CONFIG`: the exact response cache's mode, lifetimes,
 * sharing and hit price, with rules for one key, one model or both, resolved with every
 * default (docs/configuration.md, "Response cache"; the cache itself: docs/cache.md).
 */
import { z } from "zod";
import { ConfigIdSchema } from "./models.ts";

/** Largest answer Cloudflare's Cache API keeps (512 MB), and so the most an entry may be. */
export const CACHE_API_MAX_BYTES = 512 * 1024 * 1024;

/** Longest lifetime of an entry: the Cache API keeps nothing longer than a year. */
export const MAX_CACHE_TTL_SECONDS = 365 * 86_400;

const PriceShare = z
  .number()
  .min(0)
  .max(1)
  .refine((share) => Math.abs(share * 1e6 - Math.round(share * 1e6)) < 1e-6, {
    message: "Expected a share from 0 to 1 with at most six decimal places.",
  });

// Each rule may set every one of these; the section's values are the defaults.
const CACHE_FIELDS = {
  /**
   * `off`: never; `request`: only requests that send `x-warmgate-cache-ttl`; `on`: every
   * request that may be cached.
   */
  mode: z.enum(["off", "request", "on"]),
  /** Lifetime of an entry when the request names none. */
  ttl_seconds: z.int().min(1).max(MAX_CACHE_TTL_SECONDS),
  /** Longest lifetime a request may ask for with `x-warmgate-cache-ttl`. */
  max_ttl_seconds: z.int().min(1).max(MAX_CACHE_TTL_SECONDS),
  /** Largest answer stored, in bytes; a longer one passes through uncached. */
  max_entry_bytes: z.int().min(1).max(CACHE_API_MAX_BYTES),
  /**
   * `key`: entries belong to the API key (and end user); `team`: to the key's team (and end
   * user), or to the key when it has none; `shared`: to every key of the model.
   */
  scope: z.enum(["key", "team", "shared"]),
  /** Share of the answer's price a hit is billed at (0: free, 1: full price). */
  price_share: PriceShare,
  /** Cache requests that sample (no `temperature: 0`, no `seed`) without being asked per request. */
  sampled: z.boolean(),
};

const CacheRuleSchema = z
  .strictObject({
    /** The key id (`key_…`) the rule is for; absent: every key. */
    key: ConfigIdSchema.optional(),
    /** The model id the rule is for; absent: every model. */
    model: ConfigIdSchema.optional(),
    mode: CACHE_FIELDS.mode.optional(),
    ttl_seconds: CACHE_FIELDS.ttl_seconds.optional(),
    max_ttl_seconds: CACHE_FIELDS.max_ttl_seconds.optional(),
    max_entry_bytes: CACHE_FIELDS.max_entry_bytes.optional(),
    scope: CACHE_FIELDS.scope.optional(),
    price_share: CACHE_FIELDS.price_share.optional(),
    sampled: CACHE_FIELDS.sampled.optional(),
  })
  .refine((rule) => rule.key !== undefined || rule.model !== undefined, {
    message: "A cache rule names a key, a model or both.",
  });

/** The cache section as written, resolved: defaults applied, rules kept in order. */
export const CacheSectionSchema = z
  .strictObject({
    mode: CACHE_FIELDS.mode.default("request"),
    ttl_seconds: CACHE_FIELDS.ttl_seconds.default(300),
    max_ttl_seconds: CACHE_FIELDS.max_ttl_seconds.default(86_400),
    max_entry_bytes: CACHE_FIELDS.max_entry_bytes.default(4 * 1024 * 1024),
    scope: CACHE_FIELDS.scope.default("key"),
    price_share: CACHE_FIELDS.price_share.default(0),
    sampled: CACHE_FIELDS.sampled.default(false),
    /** Settings for one key, one model or both; later rules win, field by field. */
    rules: z.array(CacheRuleSchema).max(10_000).default([]),
  })
  .transform(({ rules, ...defaults }) => ({ defaults: settingsOf(defaults), rules }));

/** The cache section, resolved. */
export type CacheSection = z.output<typeof CacheSectionSchema>;

type CacheFields = { [F in keyof typeof CACHE_FIELDS]: z.output<(typeof CACHE_FIELDS)[F]> };

/** What the cache does for one key and model. */
export interface CacheSettings {
  mode: CacheFields["mode"];
  ttlSeconds: number;
  maxTtlSeconds: number;
  maxEntryBytes: number;
  scope: CacheFields["scope"];
  /** {@link CacheFields.price_share} in parts per million, exact. */
  pricePpm: number;
  sampled: boolean;
}

function settingsOf(fields: CacheFields): CacheSettings {
  return {
    mode: fields.mode,
    ttlSeconds: fields.ttl_seconds,
    maxTtlSeconds: fields.max_ttl_seconds,
    maxEntryBytes: fields.max_entry_bytes,
    scope: fields.scope,
    pricePpm: Math.round(fields.price_share * 1e6),
    sampled: fields.sampled,
  };
}

/**
 * The settings for requests of `keyId` on `model`: the section's, with every rule that
 * names this key, this model or both applied in order (later rules win, field by field).
 */
export function cacheSettings(section: CacheSection, keyId: string, model: string): CacheSettings {
  if (section.rules.length === 0) return section.defaults;
  let fields: CacheFields | null = null;
  for (const rule of section.rules) {
    if (rule.key !== undefined && rule.key !== keyId) continue;
    if (rule.model !== undefined && rule.model !== model) continue;
    fields ??= writtenOf(section.defaults);
    for (const name of Object.keys(CACHE_FIELDS) as (keyof CacheFields)[]) {
      const value = rule[name];
      if (value !== undefined) (fields as Record<string, unknown>)[name] = value;
    }
  }
  return fields === null ? section.defaults : settingsOf(fields);
}

function writtenOf(settings: CacheSettings): CacheFields {
  return {
    mode: settings.mode,
    ttl_seconds: settings.ttlSeconds,
    max_ttl_seconds: settings.maxTtlSeconds,
    max_entry_bytes: settings.maxEntryBytes,
    scope: settings.scope,
    price_share: settings.pricePpm / 1e6,
    sampled: settings.sampled,
  };
}
