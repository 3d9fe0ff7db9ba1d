import { describe, expect, it } from "vitest";
import {
  formatResetDuration,
  rateLimitHeaders,
  retryAfterHeaders,
} from "../../../functions/accounts/rate-limit-headers.ts";

describe("formatResetDuration", () => {
  it("writes durations the way OpenAI does", () => {
    expect(formatResetDuration(0)).toBe("0s");
    expect(formatResetDuration(120)).toBe("120ms");
    expect(formatResetDuration(999)).toBe("999ms");
    expect(formatResetDuration(1_000)).toBe("1s");
    expect(formatResetDuration(1_500)).toBe("1.5s");
    expect(formatResetDuration(59_992)).toBe("59.992s");
    expect(formatResetDuration(360_000)).toBe("6m0s");
    expect(formatResetDuration(90_250)).toBe("1m30.25s");
    expect(formatResetDuration(3_600_000)).toBe("1h0m0s");
  });

  it("rounds fractional milliseconds up and clamps negatives to zero", () => {
    expect(formatResetDuration(0.2)).toBe("1ms");
    expect(formatResetDuration(-5)).toBe("0s");
  });
});

describe("rateLimitHeaders", () => {
  it("never shows more remaining than the limit, nor less than none", () => {
    const headers = rateLimitHeaders({
      requests: { limit: 600, remaining: 604, resetMs: 0 },
      tokens: { limit: 1_000_000, remaining: -3.5, resetMs: 6 },
    });
    expect(headers["x-ratelimit-remaining-requests"]).toBe("600");
    expect(headers["x-ratelimit-remaining-tokens"]).toBe("0");
  });

  it("sends the six x-ratelimit headers", () => {
    expect(
      rateLimitHeaders({
        requests: { limit: 60, remaining: 59, resetMs: 1_000 },
        tokens: { limit: 150_000, remaining: 149_984, resetMs: 6 },
      }),
    ).toEqual({
      "x-ratelimit-limit-requests": "60",
      "x-ratelimit-remaining-requests": "59",
      "x-ratelimit-reset-requests": "1s",
      "x-ratelimit-limit-tokens": "150000",
      "x-ratelimit-remaining-tokens": "149984",
      "x-ratelimit-reset-tokens": "6ms",
    });
  });
});

describe("retryAfterHeaders", () => {
  it("gives whole seconds (at least one) and exact milliseconds", () => {
    expect(retryAfterHeaders(6_000)).toEqual({ "retry-after": "6", "retry-after-ms": "6000" });
    expect(retryAfterHeaders(120)).toEqual({ "retry-after": "1", "retry-after-ms": "120" });
    expect(retryAfterHeaders(1_001)).toEqual({ "retry-after": "2", "retry-after-ms": "1001" });
  });
});
