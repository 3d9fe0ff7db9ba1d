/**
 * What the response cache does for one request (docs/cache.md, "When"): its headers read
 * and checked (`x-warmgate-cache-ttl`, `x-warmgate-skip-cache`, `x-warmgate-cache-key`),
 * then its key's and model's settings and whether the body asks for a repeatable answer
 * decide between using the cache and passing it by. Pure.
 */
import type { CacheSettings } from "../../contracts/config/cache.ts";
import { type ApiError, invalidRequest } from "../../contracts/errors.ts";
import { type CacheKind, isDeterministic } from "./key.ts";

/** The lifetime a request asks its answer to be kept for, in seconds. */
export const CACHE_TTL_HEADER = "x-warmgate-cache-ttl";
/** `true`: neither read nor write the cache for this request. */
export const SKIP_CACHE_HEADER = "x-warmgate-skip-cache";
/** The caller's own name for the entry, used instead of the body. */
export const CACHE_KEY_HEADER = "x-warmgate-cache-key";
/** On the answer: `HIT`, `MISS` or `BYPASS`. */
export const CACHE_STATUS_HEADER = "x-warmgate-cache";

/** Printable ASCII without spaces, up to 256 characters. */
const CUSTOM_KEY = /^[\x21-\x7e]{1,256}$/;

/** The cache headers of a request, checked. */
export interface CacheHeaders {
  ttlSeconds: number | null;
  skip: boolean;
  customKey: string | null;
}

/** Reads the cache headers; a value they may not have is OpenAI's 400. */
export function readCacheHeaders(
  header: (name: string) => string | undefined,
  maxTtlSeconds: number,
): { ok: true; headers: CacheHeaders } | { ok: false; error: ApiError } {
  const ttl = header(CACHE_TTL_HEADER);
  const skip = header(SKIP_CACHE_HEADER);
  const customKey = header(CACHE_KEY_HEADER);
  let ttlSeconds: number | null = null;
  if (ttl !== undefined) {
    ttlSeconds = /^\d{1,10}$/.test(ttl.trim()) ? Number(ttl.trim()) : Number.NaN;
    if (!(ttlSeconds >= 1 && ttlSeconds <= maxTtlSeconds)) {
      return badHeader(CACHE_TTL_HEADER, `a whole number of seconds from 1 to ${maxTtlSeconds}`);
    }
  }
  const skipValue = skip?.trim().toLowerCase();
  if (skipValue !== undefined && skipValue !== "true" && skipValue !== "false") {
    return badHeader(SKIP_CACHE_HEADER, "`true` or `false`");
  }
  if (customKey !== undefined && !CUSTOM_KEY.test(customKey)) {
    return badHeader(CACHE_KEY_HEADER, "1 to 256 printable ASCII characters without spaces");
  }
  return {
    ok: true,
    headers: { ttlSeconds, skip: skipValue === "true", customKey: customKey ?? null },
  };
}

function badHeader(name: string, expected: string): { ok: false; error: ApiError } {
  return {
    ok: false,
    error: invalidRequest(`Invalid ${name} header: expected ${expected}.`, name, "invalid_value"),
  };
}

/** Why a request passes the cache by. */
export type BypassReason = "off" | "not_asked" | "skipped" | "sampled";

/** The cache's decision for one request. */
export type CacheDecision =
  | { use: true; ttlSeconds: number; customKey: string | null }
  | { use: false; reason: BypassReason };

/**
 * Uses the cache when the settings allow it (`on`, or `request` with a TTL header) and the
 * request was not told to skip it, for a body that repeats, or for one that samples when
 * the settings say `sampled` or the caller named the entry itself.
 */
export function cacheDecision(
  settings: CacheSettings,
  headers: CacheHeaders,
  kind: CacheKind,
  body: Record<string, unknown>,
): CacheDecision {
  if (settings.mode === "off") return { use: false, reason: "off" };
  if (headers.skip) return { use: false, reason: "skipped" };
  if (settings.mode === "request" && headers.ttlSeconds === null) {
    return { use: false, reason: "not_asked" };
  }
  const asked = settings.sampled || headers.customKey !== null;
  if (!asked && !isDeterministic(kind, body)) return { use: false, reason: "sampled" };
  return {
    use: true,
    ttlSeconds: headers.ttlSeconds ?? settings.ttlSeconds,
    customKey: headers.customKey,
  };
}
