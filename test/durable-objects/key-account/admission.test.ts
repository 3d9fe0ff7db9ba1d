import { describe, expect, it } from "vitest";
import {
  decideAdmission,
  tokenCorrection,
  type AdmissionInput,
  type AdmissionRequest,
  type KeyPolicy,
  type ScopeUsage,
} from "../../../durable-objects/key-account/admission.ts";
import { NO_BUDGETS } from "../../../durable-objects/key-account/types.ts";
import {
  CONCURRENCY_RETRY_MS,
  type SpendState,
  billingCap,
} from "../../../durable-objects/key-account/budgets.ts";

const key: KeyPolicy = {
  status: "active",
  expiresAt: null,
  models: null,
  allowedOrigins: ["https://app.example"],
  limits: { rpm: 10, tpm: 1_000, concurrency: 2 },
  budgets: NO_BUDGETS,
};
const idle: ScopeUsage = { requests: null, tokens: null, inFlight: 0 };
const nothingSpent: SpendState = {
  day: { settledPicos: 0n, reservedPicos: 0n },
  month: { settledPicos: 0n, reservedPicos: 0n },
  lifetime: { settledPicos: 0n, reservedPicos: 0n },
};
// Whole micro-dollars (what budgets are set in) as pico-dollars (what amounts are).
const micros = (n: number) => BigInt(n) * 1_000_000n;

/** A request for one model, `m`. */
function single(
  overrides: {
    promptTokens?: number;
    maxTokens?: number;
    origin?: string | null;
    picos?: bigint;
  } = {},
): AdmissionRequest {
  return {
    candidates: [
      { model: "m", maxTokens: overrides.maxTokens ?? 90, worstCasePicos: overrides.picos ?? 0n },
    ],
    promptTokens: overrides.promptTokens ?? 10,
    origin: overrides.origin ?? null,
    now: 0,
  };
}

function input(overrides: Partial<AdmissionInput> = {}): AdmissionInput {
  return {
    key,
    endUser: null,
    usage: { key: idle, endUser: null },
    spend: nothingSpent,
    request: single(),
    ...overrides,
  };
}

describe("decideAdmission", () => {
  it("admits and takes one request and the reserved tokens", () => {
    const { decision, state } = decideAdmission(input());
    expect(decision).toEqual({
      ok: true,
      models: ["m"],
      reservedTokens: 100,
      reservedPicos: 0n,
      rateLimit: {
        requests: { limit: 10, remaining: 9, resetMs: 6_000 },
        tokens: { limit: 1_000, remaining: 900, resetMs: 6_000 },
      },
    });
    expect(state.key.requests.level).toBe(9);
    expect(state.key.tokens.level).toBe(900);
  });

  it("refuses a revoked key and an expired one", () => {
    expect(decideAdmission(input({ key: { ...key, status: "revoked" } })).decision).toEqual({
      ok: false,
      code: "invalid_api_key",
      reason: "revoked",
    });
    const expired = { ...key, expiresAt: 0 };
    expect(decideAdmission(input({ key: expired })).decision).toMatchObject({ reason: "expired" });
  });

  it("refuses a model outside the key's list or the token's list", () => {
    const limited = decideAdmission(input({ key: { ...key, models: ["other"] } }));
    expect(limited.decision).toEqual({ ok: false, code: "model_not_allowed", model: "m" });
    const token = decideAdmission(
      input({
        endUser: { subject: "user:u", limits: key.limits, models: ["other"] },
        usage: { key: idle, endUser: idle },
      }),
    );
    expect(token.decision).toMatchObject({ code: "model_not_allowed" });
  });

  it("refuses a browser origin the key does not allow", () => {
    const request = single({ promptTokens: 1, maxTokens: 1, origin: "https://evil.example" });
    expect(decideAdmission(input({ request })).decision).toEqual({
      ok: false,
      code: "origin_not_allowed",
      origin: "https://evil.example",
    });
    const allowed = { ...request, origin: "https://app.example" };
    expect(decideAdmission(input({ request: allowed })).decision.ok).toBe(true);
  });

  it("rejects the request beyond the concurrency limit", () => {
    const busy = { ...idle, inFlight: 2 };
    expect(decideAdmission(input({ usage: { key: busy, endUser: null } })).decision).toMatchObject({
      ok: false,
      code: "rate_limit_exceeded",
      limit: "concurrency",
      scope: "key",
      retryAfterMs: CONCURRENCY_RETRY_MS,
    });
  });

  it("rejects the 11th request in the window and reserves nothing", () => {
    const empty = { ...idle, requests: { level: 0, updatedAt: 0 } };
    const { decision, state } = decideAdmission(input({ usage: { key: empty, endUser: null } }));
    expect(decision).toMatchObject({ ok: false, limit: "requests", retryAfterMs: 6_000 });
    expect(state.key.tokens.level).toBe(1_000);
  });

  it("reports the limit that needs the longest wait", () => {
    const both = {
      ...idle,
      requests: { level: 0.5, updatedAt: 0 },
      tokens: { level: 0, updatedAt: 0 },
    };
    expect(decideAdmission(input({ usage: { key: both, endUser: null } })).decision).toMatchObject({
      limit: "tokens",
      requested: 100,
      retryAfterMs: 6_000,
    });
  });

  it("flags a request that can never fit the token limit", () => {
    const request = single({ promptTokens: 500, maxTokens: 600 });
    expect(decideAdmission(input({ request })).decision).toMatchObject({
      limit: "tokens",
      tooLarge: true,
    });
  });

  it("applies an end user's narrower limits beside the key's", () => {
    const endUser = {
      subject: "user:u",
      limits: { rpm: 1, tpm: 1_000, concurrency: 1 },
      models: null,
    };
    const first = decideAdmission(input({ endUser, usage: { key: idle, endUser: idle } }));
    expect(first.decision).toMatchObject({ ok: true, rateLimit: { requests: { remaining: 0 } } });
    expect(first.state.endUser?.requests.level).toBe(0);
    const second = decideAdmission(
      input({
        endUser,
        usage: {
          key: { requests: first.state.key.requests, tokens: first.state.key.tokens, inFlight: 1 },
          endUser: { requests: first.state.endUser?.requests ?? null, tokens: null, inFlight: 1 },
        },
      }),
    );
    expect(second.decision).toMatchObject({ ok: false, scope: "end_user" });
  });
});

describe("alias candidates", () => {
  const candidates = [
    { model: "small", maxTokens: 100, worstCasePicos: micros(50) },
    { model: "large", maxTokens: 300, worstCasePicos: micros(400) },
  ];

  it("keeps the allowed candidates in order and reserves the largest of each", () => {
    const request = { candidates, promptTokens: 10, origin: null, now: 0 };
    expect(decideAdmission(input({ request })).decision).toMatchObject({
      ok: true,
      models: ["small", "large"],
      reservedTokens: 310,
      reservedPicos: micros(400),
    });
    const narrow = decideAdmission(input({ key: { ...key, models: ["small"] }, request }));
    expect(narrow.decision).toMatchObject({
      models: ["small"],
      reservedTokens: 110,
      reservedPicos: micros(50),
    });
  });

  it("refuses when the key allows none of them, naming the first", () => {
    const request = { candidates, promptTokens: 10, origin: null, now: 0 };
    expect(
      decideAdmission(input({ key: { ...key, models: ["other"] }, request })).decision,
    ).toEqual({ ok: false, code: "model_not_allowed", model: "small" });
  });
});

// Spend in every period, in pico-dollars.
const spent = (day: bigint, reserved = 0n): SpendState => ({
  day: { settledPicos: day, reservedPicos: reserved },
  month: { settledPicos: day, reservedPicos: reserved },
  lifetime: { settledPicos: day, reservedPicos: reserved },
});
const budgeted = (budgets: Partial<KeyPolicy["budgets"]>): KeyPolicy => ({
  ...key,
  budgets: { ...NO_BUDGETS, ...budgets },
});

describe("budgets", () => {
  it("admits a request whose worst case fits exactly, and reserves it", () => {
    const result = decideAdmission(
      input({
        key: budgeted({ dayMicros: 1_000 }),
        spend: spent(micros(600), micros(100)),
        request: single({ picos: micros(300) }),
      }),
    );
    expect(result.decision).toMatchObject({ ok: true, reservedPicos: micros(300) });
  });

  it("refuses one pico-dollar over with insufficient_quota and takes nothing", () => {
    const { decision, state } = decideAdmission(
      input({
        key: budgeted({ dayMicros: 1_000 }),
        spend: spent(micros(600) - 7n, micros(100) + 3n),
        request: single({ picos: micros(300) + 5n }),
      }),
    );
    expect(decision).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      budget: "day",
      limitPicos: micros(1_000),
      spentPicos: micros(600) - 7n,
      reservedPicos: micros(100) + 3n,
      requestedPicos: micros(300) + 5n,
    });
    expect(state.key.requests.level).toBe(10);
  });

  it("says a retry may help soon when only open reservations are in the way", () => {
    const { decision } = decideAdmission(
      input({
        key: budgeted({ dayMicros: 1_000 }),
        spend: spent(micros(600), micros(300)),
        request: single({ picos: micros(300) }),
      }),
    );
    expect(decision).toMatchObject({ budget: "day", retryAfterMs: CONCURRENCY_RETRY_MS });
  });

  it("says when the next period starts for a spent day or month, and never for a spent credit", () => {
    const now = Date.UTC(2026, 10, 3, 23, 0, 0);
    const request = { ...single({ picos: micros(10) }), now };
    const day = decideAdmission(
      input({ key: budgeted({ dayMicros: 5 }), spend: spent(0n), request }),
    );
    expect(day.decision).toMatchObject({ budget: "day", retryAfterMs: 3_600_000 });
    const month = decideAdmission(
      input({ key: budgeted({ monthMicros: 5 }), spend: spent(0n), request }),
    );
    expect(month.decision).toMatchObject({
      budget: "month",
      retryAfterMs: Date.UTC(2026, 11, 1) - now,
    });
    const credit = decideAdmission(
      input({ key: budgeted({ creditMicros: 5, dayMicros: 5 }), spend: spent(0n), request }),
    );
    expect(credit.decision).toMatchObject({ budget: "credit", retryAfterMs: null });
  });

  it("checks rate limits before budgets", () => {
    const busy = { ...idle, inFlight: 2 };
    const { decision } = decideAdmission(
      input({
        key: budgeted({ dayMicros: 0 }),
        usage: { key: busy, endUser: null },
        request: single({ picos: 1n }),
      }),
    );
    expect(decision).toMatchObject({ code: "rate_limit_exceeded", limit: "concurrency" });
  });
});

describe("billingCap", () => {
  it("allows the reservation plus the tightest budget's room, and no cap without budgets", () => {
    // Day: 1000 − 300 settled − 200 reserved (this request's 100 among them) = 500 left.
    const spend = spent(micros(300), micros(200));
    expect(billingCap({ ...NO_BUDGETS, dayMicros: 1_000 }, spend, micros(100))).toBe(micros(600));
    expect(
      billingCap({ ...NO_BUDGETS, dayMicros: 1_000, creditMicros: 600 }, spend, micros(100)),
    ).toBe(micros(200));
    expect(billingCap({ ...NO_BUDGETS, creditMicros: 100 }, spend, micros(100))).toBe(micros(100));
    expect(billingCap(NO_BUDGETS, spend, micros(100))).toBeNull();
    // Room below a micro-dollar counts to the pico-dollar.
    expect(billingCap({ ...NO_BUDGETS, creditMicros: 1 }, spent(300_001n), 0n)).toBe(699_999n);
  });
});

describe("tokenCorrection", () => {
  it("refunds unused tokens, charges overuse and keeps the reservation without usage", () => {
    expect(tokenCorrection(100, 40)).toBe(60);
    expect(tokenCorrection(100, 130)).toBe(-30);
    expect(tokenCorrection(100, null)).toBe(0);
  });

  it("gives the whole reservation back when no origin began answering", () => {
    expect(tokenCorrection(100, null, false)).toBe(100);
    expect(tokenCorrection(100, 40, false)).toBe(60);
  });
});
