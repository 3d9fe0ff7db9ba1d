import { describe, expect, it } from "vitest";
import {
  CONCURRENCY_RETRY_MS,
  decideAdmission,
  tokenCorrection,
  type AdmissionInput,
  type KeyPolicy,
  type ScopeUsage,
} from "../../durable-objects/admission.ts";

const key: KeyPolicy = {
  status: "active",
  expiresAt: null,
  models: null,
  allowedOrigins: ["https://app.example"],
  limits: { rpm: 10, tpm: 1_000, concurrency: 2 },
};
const idle: ScopeUsage = { requests: null, tokens: null, inFlight: 0 };

function input(overrides: Partial<AdmissionInput> = {}): AdmissionInput {
  return {
    key,
    endUser: null,
    usage: { key: idle, endUser: null },
    request: { model: "m", promptTokens: 10, maxTokens: 90, origin: null, now: 0 },
    ...overrides,
  };
}

describe("decideAdmission", () => {
  it("admits and takes one request and the reserved tokens", () => {
    const { decision, state } = decideAdmission(input());
    expect(decision).toEqual({
      ok: true,
      reservedTokens: 100,
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
    const request = {
      model: "m",
      promptTokens: 1,
      maxTokens: 1,
      origin: "https://evil.example",
      now: 0,
    };
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
    const request = { model: "m", promptTokens: 500, maxTokens: 600, origin: null, now: 0 };
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

describe("tokenCorrection", () => {
  it("refunds unused tokens, charges overuse and keeps the reservation without usage", () => {
    expect(tokenCorrection(100, 40)).toBe(60);
    expect(tokenCorrection(100, 130)).toBe(-30);
    expect(tokenCorrection(100, null)).toBe(0);
  });
});
