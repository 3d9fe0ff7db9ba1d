import { describe, expect, it } from "vitest";
import {
  decideAdmission,
  tokenCorrection,
  type AdmissionInput,
  type AdmissionRequest,
  type KeyPolicy,
  type ScopeUsage,
} from "../../../durable-objects/key-account/admission.ts";
import { type Budgets, NO_BUDGETS } from "../../../durable-objects/key-account/budget-types.ts";
import {
  CONCURRENCY_RETRY_MS,
  type BudgetLine,
  type PeriodSpend,
  billingCap,
  budgetLines,
} from "../../../durable-objects/key-account/budgets.ts";

const key: KeyPolicy = {
  status: "active",
  expiresAt: null,
  models: null,
  allowedOrigins: ["https://app.example"],
  limits: { rpm: 10, tpm: 1_000, concurrency: 2 },
  modelLimits: {},
};
const idle: ScopeUsage = { requests: null, tokens: null, inFlight: 0 };
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
    budgets: { key: [], endUser: [] },
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

// The same spend in every budget's window, in pico-dollars.
const spent = (settled: bigint, reserved = 0n): PeriodSpend => ({
  settledPicos: settled,
  reservedPicos: reserved,
});
/** The key's budgets at `now` with `spend` in each window. */
function lines(budgets: Partial<Budgets>, spend: PeriodSpend, now = 0): BudgetLine[] {
  const all = { ...NO_BUDGETS, ...budgets };
  return budgetLines(
    all,
    now,
    () => spend,
    () => spend,
  );
}
const period = (name: string, limitMicros: number) => ({
  period: name,
  limitMicros,
  softMicros: null,
});
const day = (limitMicros: number): Partial<Budgets> => ({ periods: [period("1d", limitMicros)] });
const keyBudgets = (forKey: BudgetLine[]) => ({ key: forKey, endUser: [] });

describe("budgets", () => {
  it("admits a request whose worst case fits exactly, and reserves it", () => {
    const result = decideAdmission(
      input({
        budgets: keyBudgets(lines(day(1_000), spent(micros(600), micros(100)))),
        request: single({ picos: micros(300) }),
      }),
    );
    expect(result.decision).toMatchObject({ ok: true, reservedPicos: micros(300) });
  });

  it("refuses one pico-dollar over with insufficient_quota and takes nothing", () => {
    const { decision, state } = decideAdmission(
      input({
        budgets: keyBudgets(lines(day(1_000), spent(micros(600) - 7n, micros(100) + 3n))),
        request: single({ picos: micros(300) + 5n }),
      }),
    );
    expect(decision).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      budget: "1d",
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
        budgets: keyBudgets(lines(day(1_000), spent(micros(600), micros(300)))),
        request: single({ picos: micros(300) }),
      }),
    );
    expect(decision).toMatchObject({ budget: "1d", retryAfterMs: CONCURRENCY_RETRY_MS });
  });

  it("says when the window ends for a spent period, and never for a spent credit", () => {
    const now = Date.UTC(2026, 10, 3, 23, 20, 0);
    const request = { ...single({ picos: micros(1) }), now };
    const refusal = (budgets: Partial<Budgets>) =>
      decideAdmission(
        input({ budgets: keyBudgets(lines(budgets, spent(micros(5)), now)), request }),
      ).decision;
    expect(refusal(day(5))).toMatchObject({
      budget: "1d",
      retryAfterMs: 40 * 60_000,
      resetsAt: Date.UTC(2026, 10, 4),
    });
    expect(refusal({ periods: [period("1h", 5)] })).toMatchObject({
      budget: "1h",
      retryAfterMs: 40 * 60_000,
    });
    // Seven-day windows are aligned to the epoch: they start on Thursdays, 00:00 UTC.
    expect(refusal({ periods: [period("7d", 5)] })).toMatchObject({
      budget: "7d",
      resetsAt: Date.UTC(2026, 10, 5),
    });
    expect(refusal({ periods: [period("month", 5)] })).toMatchObject({
      budget: "month",
      retryAfterMs: Date.UTC(2026, 11, 1) - now,
    });
    // Of several spent budgets, the one in the way longest is named.
    expect(refusal({ periods: [period("1h", 5), period("30d", 5)] })).toMatchObject({
      budget: "30d",
    });
    expect(refusal({ creditMicros: 5, ...day(5) })).toMatchObject({
      budget: "credit",
      retryAfterMs: null,
      resetsAt: null,
    });
  });

  it("says no retry helps a request whose worst case is more than the whole budget", () => {
    const now = Date.UTC(2026, 10, 3, 23, 20, 0);
    const { decision } = decideAdmission(
      input({
        budgets: keyBudgets(lines({ periods: [period("1h", 5)] }, spent(0n), now)),
        request: { ...single({ picos: micros(6) }), now },
      }),
    );
    expect(decision).toMatchObject({ budget: "1h", retryAfterMs: null });
  });

  it("refuses for the end user's budget when the key's has room", () => {
    const { decision } = decideAdmission(
      input({
        budgets: { key: lines(day(1_000), spent(0n)), endUser: lines(day(5), spent(0n)) },
        request: single({ picos: micros(10) }),
      }),
    );
    expect(decision).toMatchObject({ code: "insufficient_quota", scope: "end_user", budget: "1d" });
  });

  it("checks rate limits before budgets", () => {
    const busy = { ...idle, inFlight: 2 };
    const { decision } = decideAdmission(
      input({
        budgets: keyBudgets(lines(day(0), spent(0n))),
        usage: { key: busy, endUser: null },
        request: single({ picos: 1n }),
      }),
    );
    expect(decision).toMatchObject({ code: "rate_limit_exceeded", limit: "concurrency" });
  });
});

describe("per-model limits", () => {
  const limited: KeyPolicy = { ...key, modelLimits: { m: { rpm: 2, tpm: null } } };

  it("takes a request from its model's bucket, and refuses one the model has no room for", () => {
    const first = decideAdmission(input({ key: limited }));
    expect(first.decision.ok).toBe(true);
    expect(first.state.models["m"]?.requests?.level).toBe(1);
    expect(first.state.models["m"]?.tokens).toBeNull();
    const empty = { requests: { level: 0, updatedAt: 0 }, tokens: null };
    const { decision, state } = decideAdmission(
      input({ key: limited, usage: { key: idle, endUser: null, models: { m: empty } } }),
    );
    expect(decision).toMatchObject({
      ok: false,
      code: "rate_limit_exceeded",
      scope: "model",
      model: "m",
      limit: "requests",
      limitValue: 2,
      retryAfterMs: 30_000,
    });
    // Nothing is taken from the key when the model refuses.
    expect(state.key.requests.level).toBe(10);
  });

  it("leaves other models to the key's limits alone", () => {
    const other = { ...single(), candidates: [{ model: "n", maxTokens: 90, worstCasePicos: 0n }] };
    const { decision, state } = decideAdmission(input({ key: limited, request: other }));
    expect(decision.ok).toBe(true);
    expect(state.models).toEqual({});
  });
});

describe("billingCap", () => {
  it("allows the reservation plus the tightest budget's room, and no cap without budgets", () => {
    // Day: 1000 − 300 settled − 200 reserved (this request's 100 among them) = 500 left.
    const spend = spent(micros(300), micros(200));
    expect(billingCap(lines(day(1_000), spend), micros(100))).toBe(micros(600));
    expect(billingCap(lines({ ...day(1_000), creditMicros: 600 }, spend), micros(100))).toBe(
      micros(200),
    );
    expect(billingCap(lines({ creditMicros: 100 }, spend), micros(100))).toBe(micros(100));
    expect(billingCap(lines({}, spend), micros(100))).toBeNull();
    // Room below a micro-dollar counts to the pico-dollar.
    expect(billingCap(lines({ creditMicros: 1 }, spent(300_001n)), 0n)).toBe(699_999n);
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
