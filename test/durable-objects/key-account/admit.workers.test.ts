import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { LIMITS, newKey, openReservations } from "../../support/key-accounts.workers.ts";

describe("KeyAccount admission", () => {
  it("admits exactly 10 of 100 concurrent requests against a concurrency limit of 10", async () => {
    const { id, secretHash } = await newKey({ concurrency: 10 });
    // A fresh stub per call, so the calls interleave as they would from many isolates.
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) =>
        env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id)).admit({
          requestId: `r${i}`,
          credential: { kind: "key", secretHash },
          model: "m",
          promptTokens: 1,
          maxTokens: 1,
        }),
      ),
    );
    expect(results.filter((r) => r.ok)).toHaveLength(10);
    const refused = results.filter((r) => !r.ok);
    expect(refused).toHaveLength(90);
    expect(refused[0]).toMatchObject({ code: "rate_limit_exceeded", limit: "concurrency" });
  });

  it("admits exactly as many concurrent requests as the requests-per-minute limit", async () => {
    const { admit } = await newKey({ rpm: 10, concurrency: 1_000 });
    const now = Date.now();
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) => admit(`r${i}`, { now })),
    );
    expect(results.filter((r) => r.ok)).toHaveLength(10);
    expect(results.find((r) => !r.ok)).toMatchObject({ limit: "requests", retryAfterMs: 6_000 });
  });

  it("returns the tier and the rate-limit values on admission", async () => {
    const { admit } = await newKey({ rpm: 60, tpm: 1_000 });
    const result = await admit("r1", { now: 1_000_000 });
    expect(result).toMatchObject({
      ok: true,
      tier: "high",
      reservedTokens: 100,
      rateLimit: {
        requests: { limit: 60, remaining: 59, resetMs: 1_000 },
        tokens: { limit: 1_000, remaining: 900, resetMs: 6_000 },
      },
    });
  });

  it("refuses a wrong secret and a model the key does not allow", async () => {
    const { admit, stub } = await newKey();
    expect(await admit("r1", { credential: { kind: "key", secretHash: "0".repeat(64) } })).toEqual({
      ok: false,
      code: "invalid_api_key",
      reason: "bad_secret",
      commit: expect.any(Object),
    });
    await stub.update({ models: ["only-this"], now: Date.now() });
    expect(await admit("r2")).toMatchObject({ code: "model_not_allowed", model: "m" });
    expect((await admit("r3", { model: "only-this" })).ok).toBe(true);
  });

  it("does not reserve twice when the same request id is admitted again", async () => {
    const { admit, stub } = await newKey({ concurrency: 2 });
    expect((await admit("same")).ok).toBe(true);
    expect((await admit("same")).ok).toBe(true);
    expect(await openReservations(stub)).toBe(1);
  });

  it("refuses a revoked key on its very next request", async () => {
    const { admit, stub } = await newKey();
    expect((await admit("r1")).ok).toBe(true);
    await stub.revoke(Date.now());
    expect(await admit("r2")).toEqual({
      ok: false,
      code: "invalid_api_key",
      reason: "revoked",
      commit: expect.any(Object),
    });
  });

  it("refuses an expired key", async () => {
    const { admit, stub } = await newKey();
    await stub.update({ expiresAt: 2_000_000, now: 1_000_000 });
    expect((await admit("r1", { now: 1_999_999 })).ok).toBe(true);
    expect(await admit("r2", { now: 2_000_000 })).toMatchObject({ reason: "expired" });
  });

  it("refuses a browser origin the key does not allow", async () => {
    const { admit } = await newKey();
    expect(await admit("r1", { origin: "https://evil.example" })).toMatchObject({
      code: "origin_not_allowed",
    });
    expect((await admit("r2", { origin: "https://app.example" })).ok).toBe(true);
  });
});

describe("KeyAccount end users of browser tokens", () => {
  it("limits each end user separately inside the key", async () => {
    const { admit } = await newKey();
    const userLimits = { rpm: 100, tpm: 10_000, concurrency: 1 };
    const as = (subject: string) => ({
      credential: {
        kind: "browser" as const,
        secretGeneration: 1,
        subject,
        limits: userLimits,
        models: null,
      },
    });
    expect((await admit("a1", as("user:a"))).ok).toBe(true);
    expect(await admit("a2", as("user:a"))).toMatchObject({
      code: "rate_limit_exceeded",
      limit: "concurrency",
      scope: "end_user",
    });
    expect((await admit("b1", as("user:b"))).ok).toBe(true);
  });

  it("refuses a model outside the token's models", async () => {
    const { admit } = await newKey();
    const credential = {
      kind: "browser" as const,
      secretGeneration: 1,
      subject: "user:a",
      limits: LIMITS,
      models: ["small"],
    };
    expect(await admit("a1", { credential })).toMatchObject({ code: "model_not_allowed" });
    expect((await admit("a2", { credential, model: "small" })).ok).toBe(true);
  });
});
