import { evictDurableObject, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { Limits } from "../../durable-objects/admission.ts";
import {
  RESERVATION_LEASE_MS,
  type AdmitInput,
  type KeyAccount,
} from "../../durable-objects/key-account.ts";
import { mintApiKey, newKeyId } from "../../functions/keys.ts";

const LIMITS: Limits = { rpm: 100_000, tpm: 100_000_000, concurrency: 10 };

async function newKey(limits: Partial<Limits> = {}, now = Date.now()) {
  const id = newKeyId();
  const { key, secretHash } = await mintApiKey(env, id);
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
  const record = await stub.create({
    id,
    name: "test",
    secretHash,
    limits: { ...LIMITS, ...limits },
    allowedOrigins: ["https://app.example"],
    models: null,
    tier: "high",
    expiresAt: null,
    now,
  });
  expect(record?.id).toBe(id);
  const admit = (requestId: string, extra: Partial<AdmitInput> = {}) =>
    stub.admit({
      requestId,
      credential: { kind: "key", secretHash },
      model: "m",
      promptTokens: 10,
      maxTokens: 90,
      ...extra,
    });
  return { id, key, secretHash, stub, admit };
}

async function openReservations(stub: DurableObjectStub<KeyAccount>): Promise<number> {
  return runInDurableObject(
    stub,
    (_instance: KeyAccount, state) =>
      state.storage.sql
        .exec<{ n: number }>("SELECT COUNT(*) AS n FROM reservations WHERE state = 'open'")
        .one().n,
  );
}

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
    expect(await admit("r2")).toEqual({ ok: false, code: "invalid_api_key", reason: "revoked" });
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

describe("KeyAccount settlement", () => {
  it("releases the slot on every ending path", async () => {
    const { admit, stub } = await newKey({ concurrency: 4 });
    const ids = ["a", "b", "c", "d"] as const;
    for (const id of ids) expect((await admit(id)).ok).toBe(true);
    expect(await admit("e")).toMatchObject({ limit: "concurrency" });
    const outcomes = ["ok", "error", "cancelled", "timeout"] as const;
    for (const [i, outcome] of outcomes.entries()) {
      const settled = await stub.settle({ requestId: ids[i] ?? "", outcome });
      expect(settled.settled).toBe(true);
      expect(await openReservations(stub)).toBe(3);
      expect((await admit(`after-${outcome}`)).ok).toBe(true);
    }
  });

  it("applies the settlements an admit call carries before deciding", async () => {
    const { admit, stub } = await newKey({ concurrency: 1 });
    expect((await admit("r1")).ok).toBe(true);
    expect(await admit("r2")).toMatchObject({ limit: "concurrency" });
    expect((await admit("r3", { settle: [{ requestId: "r1", outcome: "ok" }] })).ok).toBe(true);
    expect(await stub.settle({ requestId: "r1", outcome: "ok" })).toMatchObject({
      settled: false,
      reason: "already_settled",
    });
  });

  it("settles several requests in one call, each once", async () => {
    const { admit, stub } = await newKey();
    for (const id of ["a", "b"]) expect((await admit(id)).ok).toBe(true);
    const results = await stub.settleMany([
      { requestId: "a", outcome: "ok" },
      { requestId: "b", outcome: "error" },
      { requestId: "a", outcome: "ok" },
    ]);
    expect(results.map((r) => r.settled)).toEqual([true, true, false]);
    expect(await openReservations(stub)).toBe(0);
  });

  it("settles once: a repeated settle changes nothing", async () => {
    const { admit, stub } = await newKey({ tpm: 1_000 });
    const now = 5_000_000;
    expect((await admit("r1", { now })).ok).toBe(true);
    const usage = { prompt_tokens: 10, completion_tokens: 20 };
    expect(await stub.settle({ requestId: "r1", outcome: "ok", usage, now })).toEqual({
      settled: true,
      requestId: "r1",
      reservedTokens: 100,
      usedTokens: 30,
      late: false,
    });
    expect(await stub.settle({ requestId: "r1", outcome: "ok", usage, now })).toEqual({
      settled: false,
      requestId: "r1",
      reason: "already_settled",
    });
    expect(await stub.settle({ requestId: "nope", outcome: "ok", now })).toMatchObject({
      settled: false,
      reason: "unknown_request",
    });
    // 100 reserved, 30 used: 970 left, not 1_040 (the refund is applied once, capped).
    const next = await admit("r2", { now, promptTokens: 0, maxTokens: 0 });
    expect(next).toMatchObject({ ok: true, rateLimit: { tokens: { remaining: 970 } } });
  });

  it("corrects tokens with real usage above the reservation", async () => {
    const { admit, stub } = await newKey({ tpm: 1_000 });
    const now = 7_000_000;
    await admit("r1", { now });
    await stub.settle({
      requestId: "r1",
      outcome: "ok",
      usage: { prompt_tokens: 100, completion_tokens: 200 },
      now,
    });
    const next = await admit("r2", { now, promptTokens: 0, maxTokens: 0 });
    expect(next).toMatchObject({ rateLimit: { tokens: { remaining: 700 } } });
  });

  it("keeps the reservation when a request ends without usage", async () => {
    const { admit, stub } = await newKey({ tpm: 1_000 });
    const now = 8_000_000;
    await admit("r1", { now });
    await stub.settle({ requestId: "r1", outcome: "cancelled", now });
    const next = await admit("r2", { now, promptTokens: 0, maxTokens: 0 });
    expect(next).toMatchObject({ rateLimit: { tokens: { remaining: 900 } } });
  });

  it("releases a reservation that is never settled when its lease ends (alarm)", async () => {
    const { admit, stub } = await newKey({ concurrency: 1 });
    const past = Date.now() - RESERVATION_LEASE_MS - 1_000;
    expect(await admit("lost", { now: past })).toMatchObject({
      ok: true,
      leaseExpiresAt: past + RESERVATION_LEASE_MS,
    });
    // The alarm is due at once; it may already have run by itself before this call.
    await runDurableObjectAlarm(stub);
    expect(await openReservations(stub)).toBe(0);
    // Running the alarm again changes nothing.
    await runInDurableObject(stub, (instance: KeyAccount) => instance.alarm());
    expect(await openReservations(stub)).toBe(0);
    // A late settle still corrects the tokens, once.
    expect(await stub.settle({ requestId: "lost", outcome: "ok" })).toMatchObject({
      settled: true,
      late: true,
    });
    expect(await stub.settle({ requestId: "lost", outcome: "ok" })).toMatchObject({
      settled: false,
    });
    expect((await admit("next")).ok).toBe(true);
  });

  it("sets an alarm only while work is pending", async () => {
    const { admit, stub } = await newKey();
    const alarm = () =>
      runInDurableObject(stub, (_i: KeyAccount, state) => state.storage.getAlarm());
    expect(await alarm()).toBeNull();
    const now = Date.now();
    await admit("r1", { now });
    expect(await alarm()).toBe(now + RESERVATION_LEASE_MS);
  });
});

describe("KeyAccount rotation", () => {
  it("accepts the old secret within the grace period and refuses it after", async () => {
    const { admit, stub, secretHash: oldHash } = await newKey();
    const { secretHash: newHash } = await mintApiKey(env, "aaaaaaaaaaaaaaaa");
    const t = 10_000_000;
    await stub.rotate({ secretHash: newHash, graceMs: 60_000, now: t });
    const old = { kind: "key" as const, secretHash: oldHash };
    const current = { kind: "key" as const, secretHash: newHash };
    expect((await admit("a", { credential: old, now: t + 59_999 })).ok).toBe(true);
    expect(await admit("b", { credential: old, now: t + 60_000 })).toMatchObject({
      code: "invalid_api_key",
      reason: "bad_secret",
    });
    expect((await admit("c", { credential: current, now: t + 60_000 })).ok).toBe(true);
  });
});

describe("KeyAccount end users of browser tokens", () => {
  it("limits each end user separately inside the key", async () => {
    const { admit } = await newKey();
    const userLimits = { rpm: 100, tpm: 10_000, concurrency: 1 };
    const as = (subject: string) => ({
      credential: { kind: "browser" as const, subject, limits: userLimits, models: null },
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
      subject: "user:a",
      limits: LIMITS,
      models: ["small"],
    };
    expect(await admit("a1", { credential })).toMatchObject({ code: "model_not_allowed" });
    expect((await admit("a2", { credential, model: "small" })).ok).toBe(true);
  });
});

describe("KeyAccount persistence", () => {
  it("keeps its record, reservations and revocation across eviction", async () => {
    const { id, admit, stub, secretHash } = await newKey({ concurrency: 2 });
    expect((await admit("r1")).ok).toBe(true);
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect((await again.get())?.tier).toBe("high");
    expect(await openReservations(again)).toBe(1);
    const credential = { kind: "key" as const, secretHash };
    const base = { credential, model: "m", promptTokens: 1, maxTokens: 1 };
    expect((await again.admit({ ...base, requestId: "r2" })).ok).toBe(true);
    expect(await again.admit({ ...base, requestId: "r3" })).toMatchObject({ limit: "concurrency" });
    await again.revoke(Date.now());
    await evictDurableObject(again);
    const third = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await third.admit({ ...base, requestId: "r4" })).toMatchObject({ reason: "revoked" });
    expect((await third.settle({ requestId: "r1", outcome: "ok" })).settled).toBe(true);
  });
});
