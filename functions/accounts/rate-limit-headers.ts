// OpenAI's rate-limit headers. The reset values are duration strings in the form
// OpenAI sends (Go's time.Duration format: `120ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`);
// `retry-after` is whole seconds (RFC 9110 §10.2.3) and `retry-after-ms` is what the
// official SDKs read first.
// See docs/edge.md.

import type { RateLimitInfo } from "../../durable-objects/key-account/types.ts";

/** Formats milliseconds as OpenAI's reset duration string (`6m0s`, `120ms`, `1s`). */
export function formatResetDuration(ms: number): string {
  const total = Math.max(0, Math.ceil(ms));
  if (total === 0) return "0s";
  if (total < 1_000) return `${total}ms`;
  const hours = Math.floor(total / 3_600_000);
  const minutes = Math.floor((total % 3_600_000) / 60_000);
  const millis = total % 60_000;
  const seconds = `${Math.floor(millis / 1_000)}${fraction(millis % 1_000)}s`;
  if (hours > 0) return `${hours}h${minutes}m${seconds}`;
  if (minutes > 0) return `${minutes}m${seconds}`;
  return seconds;
}

/** The first of the six `x-ratelimit-*` headers: an answer that has it has all six. */
export const RATE_LIMIT_HEADER = "x-ratelimit-limit-requests";

/**
 * The six `x-ratelimit-*` headers for a key's current limits. What remains is shown within
 * 0 and the limit: an isolate's lease adds what it holds to its bucket's level at the last
 * renewal, which has refilled meanwhile (the lease's slack, docs/key-account.md).
 */
export function rateLimitHeaders(rateLimit: RateLimitInfo): Record<string, string> {
  const { requests, tokens } = rateLimit;
  return {
    [RATE_LIMIT_HEADER]: String(requests.limit),
    "x-ratelimit-remaining-requests": String(within(requests.remaining, requests.limit)),
    "x-ratelimit-reset-requests": formatResetDuration(requests.resetMs),
    "x-ratelimit-limit-tokens": String(tokens.limit),
    "x-ratelimit-remaining-tokens": String(within(tokens.remaining, tokens.limit)),
    "x-ratelimit-reset-tokens": formatResetDuration(tokens.resetMs),
  };
}

/** A wait as `retry-after` says it: whole seconds, at least 1. */
export function retryAfterSeconds(retryAfterMs: number): number {
  return Math.max(1, Math.ceil(retryAfterMs / 1_000));
}

/** `retry-after` (whole seconds, at least 1) and `retry-after-ms` for a 429 or 503. */
export function retryAfterHeaders(retryAfterMs: number): Record<string, string> {
  const ms = Math.max(0, Math.ceil(retryAfterMs));
  return { "retry-after": String(retryAfterSeconds(ms)), "retry-after-ms": String(ms) };
}

function fraction(ms: number): string {
  if (ms === 0) return "";
  return `.${String(ms).padStart(3, "0").replace(/0+$/, "")}`;
}

function within(remaining: number, limit: number): number {
  return Math.max(0, Math.min(limit, Math.floor(remaining)));
}
