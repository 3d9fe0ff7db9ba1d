import { evictDurableObject, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it, vi } from "vitest";
import { type KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { KEY_ACCOUNT_MIGRATIONS } from "../../../durable-objects/key-account/schema.ts";
import {
  ACCOUNT_WRITE_DELAY_MS,
  RESERVATION_LEASE_MS,
  type AdmitInput,
  type AdmitResult,
  type Budgets,
  type Limits,
} from "../../../durable-objects/key-account/types.ts";
import type { CommitStamp } from "../../../contracts/commit-stamp.ts";
import { mintApiKey, newKeyId } from "../../../functions/keys.ts";

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

// The account writes behind (ACCOUNT_WRITE_DELAY_MS): helpers that read its tables flush
// first, so they see what it decided.
async function openReservations(stub: DurableObjectStub<KeyAccount>): Promise<number> {
  return runInDurableObject(stub, (instance: KeyAccount, state) => {
    instance.flush();
    return state.storage.sql
      .exec<{ n: number }>("SELECT COUNT(*) AS n FROM ledger WHERE state = 'open'")
      .one().n;
  });
}

type CommittedRow = { request_id: string; state: string };

// The ledger as committed, without flushing.
function committedLedger(state: DurableObjectState): CommittedRow[] {
  return state.storage.sql
    .exec<CommittedRow>("SELECT request_id, state FROM ledger ORDER BY request_id")
    .toArray();
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
    const { results } = await stub.settleMany([
      { requestId: "a", outcome: "ok" },
      { requestId: "b", outcome: "error" },
      { requestId: "a", outcome: "ok" },
    ]);
    expect(results.map((r) => r.settled)).toEqual([true, true, false]);
    expect(await openReservations(stub)).toBe(0);
  });

  it("settles once: a repeated settle changes nothing", async () => {
    const { admit, stub } = await newKey({ tpm: 1_000 });
    const now = Date.now();
    expect((await admit("r1", { now })).ok).toBe(true);
    const usage = { prompt_tokens: 10, completion_tokens: 20 };
    expect(await stub.settle({ requestId: "r1", outcome: "ok", usage, now })).toEqual({
      settled: true,
      requestId: "r1",
      reservedTokens: 100,
      usedTokens: 30,
      costPicos: 0n,
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
    const now = Date.now();
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
    const now = Date.now();
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

describe("KeyAccount persistence", () => {
  it("keeps its record, reservations and revocation across eviction once its writes are committed", async () => {
    const { id, admit, stub, secretHash } = await newKey({ concurrency: 2 });
    expect((await admit("r1")).ok).toBe(true);
    // An eviction right after the admit could beat the write-behind timer: commit first.
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
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

// Whole micro-dollars in pico-dollars, the unit of every amount.
const micros = (n: number) => BigInt(n) * 1_000_000n;

// $0.15 / $0.075 / $0.60 per 1M input, cached input and output tokens.
const PRICE = {
  inputMicrosPerMtok: 150_000,
  cachedInputMicrosPerMtok: 75_000,
  outputMicrosPerMtok: 600_000,
};
// $1 / $0.50 / $4 per 1M tokens.
const PRICIER = {
  inputMicrosPerMtok: 1_000_000,
  cachedInputMicrosPerMtok: 500_000,
  outputMicrosPerMtok: 4_000_000,
};

async function budgetedKey(budgets: Partial<Budgets>, limits: Partial<Limits> = {}) {
  const key = await newKey({ concurrency: 1_000, ...limits });
  await key.stub.update({ budgets, now: Date.now() });
  // 774 estimated prompt tokens (1000 reserved) and 1000 max tokens: at most 150 + 600 µ$.
  const admitPriced = (requestId: string, extra: Partial<AdmitInput> = {}) =>
    key.admit(requestId, { promptTokens: 774, maxTokens: 1_000, price: PRICE, ...extra });
  return { ...key, admitPriced };
}

async function spend(stub: DurableObjectStub<KeyAccount>, period: string) {
  const row = await runInDurableObject(stub, (instance: KeyAccount, state) => {
    instance.flush();
    return state.storage.sql
      .exec<{ sm: number; sp: number; rm: number; rp: number }>(
        `SELECT settled_micros AS sm, settled_picos AS sp, reserved_micros AS rm,
           reserved_picos AS rp FROM spend WHERE period = ?`,
        period,
      )
      .toArray()[0];
  });
  // Whole micro-dollars and the pico-dollars below them (docs/key-account.md, "Storage").
  return row === undefined
    ? undefined
    : { settled: micros(row.sm) + BigInt(row.sp), reserved: micros(row.rm) + BigInt(row.rp) };
}

describe("KeyAccount costs and budgets", () => {
  it("reserves the worst-case cost and settles the exact cost, cached tokens at the cached price", async () => {
    const { admitPriced, stub } = await budgetedKey({});
    expect(await admitPriced("r1")).toMatchObject({ ok: true, reservedPicos: micros(750) });
    expect(await spend(stub, "all")).toEqual({ settled: 0n, reserved: micros(750) });
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    // 600 × 0.15 + 400 × 0.075 + 500 × 0.60 µ$
    expect(await stub.settle({ requestId: "r1", outcome: "ok", usage })).toMatchObject({
      settled: true,
      costPicos: micros(420),
    });
    expect(await spend(stub, "all")).toEqual({ settled: micros(420), reserved: 0n });
    const day = new Date().toISOString().slice(0, 10);
    expect(await spend(stub, `d:${day}`)).toEqual({ settled: micros(420), reserved: 0n });
    expect(await stub.usage({ from: day, to: day })).toEqual({
      ok: true,
      rows: [
        {
          day,
          model: "m",
          requests: 1,
          promptTokens: 1_000,
          cachedTokens: 400,
          completionTokens: 500,
          costPicos: micros(420),
        },
      ],
    });
    expect(await stub.record({ requestId: "r1" })).toMatchObject({
      ok: true,
      record: {
        state: "settled",
        outcome: "ok",
        costPicos: micros(420),
        reservedPicos: micros(750),
      },
    });
  });

  it("refuses with insufficient_quota when the reservation would overdraw the day's budget", async () => {
    const { admitPriced } = await budgetedKey({ dayMicros: 1_000 });
    expect((await admitPriced("r1")).ok).toBe(true);
    expect(await admitPriced("r2")).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      budget: "day",
      limitPicos: micros(1_000),
      reservedPicos: micros(750),
      requestedPicos: micros(750),
      retryAfterMs: 1_000,
    });
  });

  it("never overdraws a budget, whatever the interleaving of 100 concurrent requests", async () => {
    const { id, secretHash, stub } = await budgetedKey({ creditMicros: 7_500 });
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) =>
        env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id)).admit({
          requestId: `c${i}`,
          credential: { kind: "key", secretHash },
          model: "m",
          promptTokens: 774,
          maxTokens: 1_000,
          price: PRICE,
        }),
      ),
    );
    const admitted = results.filter((r) => r.ok);
    expect(admitted).toHaveLength(10);
    expect(await spend(stub, "all")).toEqual({ settled: 0n, reserved: micros(7_500) });
    // Each used all it could: the whole credit is spent, not a micro-dollar more.
    const usage = { prompt_tokens: 1_000, cached_tokens: 0, completion_tokens: 1_000 };
    await stub.settleMany(
      admitted.map((r) => ({ requestId: r.ok ? r.requestId : "", outcome: "ok" as const, usage })),
    );
    expect(await spend(stub, "all")).toEqual({ settled: micros(7_500), reserved: 0n });
    expect(
      await stub.admit({
        requestId: "after",
        credential: { kind: "key", secretHash },
        model: "m",
        promptTokens: 1,
        maxTokens: 1,
        price: PRICE,
      }),
    ).toMatchObject({ code: "insufficient_quota", budget: "credit", retryAfterMs: null });
  });

  it("bills the exact cost above the reservation when the prompt was larger than estimated", async () => {
    const { admitPriced, stub } = await budgetedKey({});
    expect((await admitPriced("r1")).ok).toBe(true);
    const usage = { prompt_tokens: 5_000, cached_tokens: 0, completion_tokens: 1_000 };
    expect(await stub.settle({ requestId: "r1", outcome: "ok", usage })).toMatchObject({
      costPicos: micros(750 + 600),
    });
  });

  it("bills above the reservation only as far as the budgets have room", async () => {
    const { admitPriced, stub } = await budgetedKey({ creditMicros: 1_000 });
    expect((await admitPriced("r1")).ok).toBe(true);
    const usage = { prompt_tokens: 5_000, cached_tokens: 0, completion_tokens: 1_000 };
    expect(await stub.settle({ requestId: "r1", outcome: "ok", usage })).toMatchObject({
      costPicos: micros(1_000),
    });
    expect(await spend(stub, "all")).toEqual({ settled: micros(1_000), reserved: 0n });
  });

  it("reserves for the priciest fallback and bills the model that served", async () => {
    const { admitPriced, stub } = await budgetedKey({});
    const fallbacks = [{ model: "big", maxTokens: 1_000, price: PRICIER }];
    expect(await admitPriced("r1", { fallbacks })).toMatchObject({
      ok: true,
      models: ["m", "big"],
      reservedPicos: micros(5_000),
    });
    const usage = { prompt_tokens: 100, cached_tokens: 0, completion_tokens: 100 };
    expect(
      await stub.settle({ requestId: "r1", outcome: "ok", usage, model: "big" }),
    ).toMatchObject({ costPicos: micros(500) });
    expect(await stub.record({ requestId: "r1" })).toMatchObject({ record: { model: "big" } });
  });

  it("bills nothing without usage and releases the whole reservation", async () => {
    const { admitPriced, stub } = await budgetedKey({ dayMicros: 750 });
    expect((await admitPriced("r1")).ok).toBe(true);
    expect(await stub.settle({ requestId: "r1", outcome: "error" })).toMatchObject({
      costPicos: 0n,
    });
    expect((await admitPriced("r2")).ok).toBe(true);
  });

  it("releases an expired reservation's cost, then bills a late settlement once", async () => {
    const { admitPriced, stub } = await budgetedKey({});
    const past = Date.now() - RESERVATION_LEASE_MS - 1_000;
    expect((await admitPriced("lost", { now: past })).ok).toBe(true);
    await runDurableObjectAlarm(stub);
    expect((await spend(stub, "all"))?.reserved).toBe(0n);
    const usage = { prompt_tokens: 10, cached_tokens: 0, completion_tokens: 10 };
    expect(await stub.settle({ requestId: "lost", outcome: "ok", usage })).toMatchObject({
      late: true,
      costPicos: 7_500_000n, // 10 × 0.15 + 10 × 0.60 µ$, to the pico-dollar
    });
    expect(await spend(stub, "all")).toEqual({ settled: 7_500_000n, reserved: 0n });
    const day = new Date(past).toISOString().slice(0, 10);
    const { rows } = (await stub.usage({ from: day, to: day })) as { rows: { requests: number }[] };
    expect(rows.map((row) => row.requests)).toEqual([1]);
  });

  it("answers usage only to the key's own secret", async () => {
    const { stub } = await budgetedKey({});
    expect(
      await stub.usage({
        from: "2026-01-01",
        to: "2026-12-31",
        credential: { kind: "key", secretHash: "0".repeat(64) },
      }),
    ).toEqual({ ok: false, code: "invalid_api_key", reason: "bad_secret" });
  });
});

describe("KeyAccount schema migration", () => {
  it("turns version-1 reservations into ledger rows with rollups, and keeps open ones open", async () => {
    const { id, stub, secretHash } = await newKey();
    const created = Date.UTC(2026, 0, 15, 12);
    await runInDurableObject(stub, (_instance: KeyAccount, state) => {
      const sql = state.storage.sql;
      for (const table of ["ledger", "usage_daily", "spend", "metrics"])
        sql.exec(`DROP TABLE ${table}`);
      sql.exec("DROP TABLE key_record");
      sql.exec("DROP TABLE secrets");
      sql.exec("DROP TABLE buckets");
      sql.exec("DELETE FROM schema_migrations");
      sql.exec(KEY_ACCOUNT_MIGRATIONS[0] ?? "");
      sql.exec("INSERT INTO schema_migrations (version, applied_at) VALUES (1, 0)");
      sql.exec(
        `INSERT INTO key_record VALUES (1, ?, 'old', 'active', 100, 100000, 10, '[]', NULL,
           'standard', NULL, ?, ?, NULL, 1)`,
        id,
        created,
        created,
      );
      sql.exec("INSERT INTO secrets VALUES (?, ?, NULL)", secretHash, created);
      sql.exec(
        `INSERT INTO reservations (request_id, state, model, reserved_tokens, created_at,
           expires_at, closed_at, outcome, prompt_tokens, completion_tokens)
         VALUES ('done', 'settled', 'm', 100, ?, ?, ?, 'ok', 30, 20)`,
        created,
        created + 1_000,
        created + 10,
      );
      sql.exec(
        `INSERT INTO reservations (request_id, state, model, reserved_tokens, created_at, expires_at)
         VALUES ('running', 'open', 'm', 100, ?, ?)`,
        created,
        Date.now() + 60_000,
      );
    });
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.get()).toMatchObject({
      name: "old",
      budgets: { dayMicros: null, monthMicros: null, creditMicros: null },
    });
    expect(await again.usage({ from: "2026-01-15", to: "2026-01-15" })).toMatchObject({
      rows: [
        { day: "2026-01-15", model: "m", requests: 1, promptTokens: 30, completionTokens: 20 },
      ],
    });
    expect(await again.record({ requestId: "running" })).toMatchObject({
      record: { state: "open", day: "2026-01-15" },
    });
    expect((await again.settle({ requestId: "running", outcome: "ok" })).settled).toBe(true);
  });
});

// An admission request of the key, but for its id.
function keyRequest(secretHash: string) {
  return {
    credential: { kind: "key" as const, secretHash },
    model: "m",
    promptTokens: 10,
    maxTokens: 90,
  };
}

describe("KeyAccount writes behind", () => {
  it("writes an admission's row before answering it, and writes a refusal behind", async () => {
    const { stub, secretHash } = await newKey({ concurrency: 1 });
    // Both calls in one turn of the object, well within the write delay.
    await runInDurableObject(stub, async (instance: KeyAccount, state) => {
      expect((await instance.admit({ ...keyRequest(secretHash), requestId: "r1" })).ok).toBe(true);
      expect(committedLedger(state)).toEqual([{ request_id: "r1", state: "open" }]);
      const refused = await instance.admit({ ...keyRequest(secretHash), requestId: "r2" });
      expect(refused).toMatchObject({ code: "rate_limit_exceeded", limit: "concurrency" });
      expect(refused.commit.pending).toBe(refused.commit.committed + 1);
      expect(committedLedger(state)).toEqual([{ request_id: "r1", state: "open" }]);
    });
  });

  it("commits the admit's writes by itself once the write delay has passed", async () => {
    const { stub, admit } = await newKey({ tpm: 1_000 });
    expect((await admit("r1")).ok).toBe(true);
    // No flush: the write-behind timer commits the row and the bucket.
    await vi.waitFor(
      async () => {
        const committed = await runInDurableObject(stub, (_instance: KeyAccount, state) => ({
          ledger: committedLedger(state),
          tokens: state.storage.sql
            .exec<{ level: number }>(
              "SELECT level FROM buckets WHERE scope = 'key' AND kind = 'tokens'",
            )
            .toArray(),
        }));
        expect(committed.ledger).toEqual([{ request_id: "r1", state: "open" }]);
        expect(committed.tokens.map((row) => Math.floor(row.level))).toEqual([900]);
      },
      { timeout: 20 * ACCOUNT_WRITE_DELAY_MS, interval: ACCOUNT_WRITE_DELAY_MS / 5 },
    );
  });

  it("writes an admission at once and its settlement as an update of the same row", async () => {
    const { stub, secretHash } = await newKey();
    const writes = await runInDurableObject(stub, async (instance: KeyAccount, state) => {
      const sql = state.storage.sql;
      // Every row the ledger receives, inserted or updated, in order.
      sql.exec("CREATE TABLE ledger_writes (request_id TEXT NOT NULL, state TEXT NOT NULL)");
      sql.exec(`CREATE TRIGGER ledger_inserted AFTER INSERT ON ledger
        BEGIN INSERT INTO ledger_writes VALUES (NEW.request_id, NEW.state); END`);
      sql.exec(`CREATE TRIGGER ledger_updated AFTER UPDATE ON ledger
        BEGIN INSERT INTO ledger_writes VALUES (NEW.request_id, NEW.state); END`);
      expect((await instance.admit({ ...keyRequest(secretHash), requestId: "r1" })).ok).toBe(true);
      const usage = { prompt_tokens: 10, completion_tokens: 5 };
      expect(await instance.settle({ requestId: "r1", outcome: "ok", usage })).toMatchObject({
        settled: true,
      });
      return sql.exec<CommittedRow>("SELECT request_id, state FROM ledger_writes").toArray();
    });
    expect(writes).toEqual([
      { request_id: "r1", state: "open" },
      { request_id: "r1", state: "settled" },
    ]);
  });

  it("never moves the alarm, a write, while steady traffic admits and settles", async () => {
    const { stub, secretHash } = await newKey();
    const t = Date.now();
    const calls = await runInDurableObject(stub, async (instance: KeyAccount, state) => {
      // The first admission sets the alarm to the end of its lease.
      await instance.admit({ ...keyRequest(secretHash), requestId: "r0", now: t });
      let setAlarm = 0;
      const storage = state.storage;
      const original = storage.setAlarm.bind(storage);
      storage.setAlarm = (...args: Parameters<DurableObjectStorage["setAlarm"]>) => {
        setAlarm++;
        return original(...args);
      };
      try {
        for (let i = 1; i <= 20; i++) {
          const settle = [{ requestId: `r${i - 1}`, outcome: "ok" as const }];
          const result = await instance.admit({
            ...keyRequest(secretHash),
            requestId: `r${i}`,
            now: t + i * 1_000,
            settle,
          });
          expect(result.ok).toBe(true);
        }
      } finally {
        storage.setAlarm = original;
      }
      return setAlarm;
    });
    expect(calls).toBe(0);
  });

  it("keeps an admission through a crash right after it was answered, and bills it once", async () => {
    const { id, stub, secretHash } = await budgetedKey({ creditMicros: 10_000 });
    // Answered, then the object crashes at once: the answer left once the admission was durable.
    const admission: AdmitResult = await stub.admit({
      ...keyRequest(secretHash),
      requestId: "lost",
      promptTokens: 774,
      maxTokens: 1_000,
      price: PRICE,
    });
    await expect(
      runInDurableObject(stub, (_instance: KeyAccount, state) => {
        state.abort("crash inside the write window");
      }),
    ).rejects.toThrow("crash inside the write window");
    expect(admission).toMatchObject({ ok: true, reservedPicos: micros(750) });
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.record({ requestId: "lost" })).toMatchObject({
      ok: true,
      record: { state: "open", reservedPicos: micros(750) },
    });

    // The edge's settlement carries what it holds of the admission.
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    const settlement = {
      requestId: "lost",
      outcome: "ok" as const,
      usage,
      admitted: { models: [{ model: "m", price: PRICE }], reservedPicos: micros(750) },
    };
    // It settles the open row it kept: the tokens it reserved come back.
    expect(await again.settle(settlement)).toMatchObject({
      settled: true,
      reservedTokens: 1_774,
      usedTokens: 1_500,
      costPicos: micros(420),
    });
    expect(await again.settle(settlement)).toMatchObject({
      settled: false,
      reason: "already_settled",
    });
    expect(await again.record({ requestId: "lost" })).toMatchObject({
      record: { state: "settled", model: "m", reservedPicos: micros(750), costPicos: micros(420) },
    });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [
        { model: "m", requests: 1, promptTokens: 1_000, cachedTokens: 400, costPicos: micros(420) },
      ],
    });
    expect(await spend(again, "all")).toEqual({ settled: micros(420), reserved: 0n });

    // Still once after an eviction: the settled row is read back from SQLite.
    await evictDurableObject(again);
    const third = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await third.settle(settlement)).toMatchObject({ reason: "already_settled" });
    expect(await spend(third, "all")).toEqual({ settled: micros(420), reserved: 0n });
  });

  it("settles a forgotten request that reports no usage at no cost", async () => {
    const { stub } = await budgetedKey({});
    const admitted = { models: [{ model: "m", price: PRICE }], reservedPicos: micros(750) };
    expect(await stub.settle({ requestId: "lost", outcome: "error", admitted })).toMatchObject({
      settled: true,
      costPicos: 0n,
    });
    expect(await stub.record({ requestId: "lost" })).toMatchObject({
      record: { state: "settled", outcome: "error", costPicos: 0n },
    });
  });

  it("does not record a settlement of a request the edge does not say it admitted", async () => {
    const { stub } = await budgetedKey({});
    const usage = { prompt_tokens: 10, completion_tokens: 10 };
    expect(await stub.settle({ requestId: "never", outcome: "ok", usage })).toMatchObject({
      settled: false,
      reason: "unknown_request",
    });
    expect(await stub.record({ requestId: "never" })).toEqual({ ok: true, record: null });
  });

  it("keeps reservations, settlements, spend and usage across eviction after a flush", async () => {
    const { id, stub, admitPriced, secretHash } = await budgetedKey({}, { concurrency: 2 });
    expect((await admitPriced("a")).ok).toBe(true);
    expect((await admitPriced("b")).ok).toBe(true);
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    // Settled by the admit that carries it: in memory only until the write-behind commits.
    const carried = await admitPriced("c", {
      settle: [{ requestId: "a", outcome: "ok", usage }],
    });
    expect(carried.ok).toBe(true);
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    await evictDurableObject(stub);

    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.record({ requestId: "a" })).toMatchObject({
      record: { state: "settled", costPicos: micros(420) },
    });
    expect(await openReservations(again)).toBe(2);
    expect(await spend(again, "all")).toEqual({ settled: micros(420), reserved: micros(1_500) });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ model: "m", requests: 1, costPicos: micros(420) }],
    });
    // Both reservations still hold the two slots.
    expect(
      await again.admit({
        requestId: "d",
        credential: { kind: "key", secretHash },
        model: "m",
        promptTokens: 1,
        maxTokens: 1,
      }),
    ).toMatchObject({ limit: "concurrency" });
  });
});

// An admit refused before anything is written: its answer only reports where commits stand.
function refusedRequest(secretHash: string, requestId: string): AdmitInput {
  return {
    ...keyRequest(secretHash),
    requestId,
    credential: { kind: "key", secretHash: "0".repeat(64) },
  };
}

describe("KeyAccount commit numbers", () => {
  it("answers an admission committed, and counts a refusal's write once the write delay committed it", async () => {
    const { stub, secretHash } = await newKey();
    const first = await stub.admit({ ...keyRequest(secretHash), requestId: "r1" });
    expect(first.ok).toBe(true);
    expect(first.commit.pending).toBe(first.commit.committed);
    await runInDurableObject(stub, (_instance: KeyAccount, state) => {
      expect(committedLedger(state)).toEqual([{ request_id: "r1", state: "open" }]);
    });
    // A refusal is counted in the key's metrics, a write behind.
    const refused = await stub.admit(refusedRequest(secretHash, "refused"));
    expect(refused.commit.pending).toBe(refused.commit.committed + 1);
    // The write-behind timer commits it; a later answer of the same incarnation says so.
    await vi.waitFor(
      async () => {
        const later = await stub.admit(refusedRequest(secretHash, "probe"));
        expect(later.commit.incarnation).toBe(refused.commit.incarnation);
        expect(later.commit.committed).toBeGreaterThanOrEqual(refused.commit.pending);
      },
      { timeout: 20 * ACCOUNT_WRITE_DELAY_MS, interval: ACCOUNT_WRITE_DELAY_MS / 5 },
    );
  });

  it("answers a standalone settlement committed", async () => {
    const { stub, admit } = await newKey();
    const admitted = await admit("r1");
    const { results, commit } = await stub.settleMany([{ requestId: "r1", outcome: "ok" }]);
    expect(results).toMatchObject([{ settled: true }]);
    expect(commit.incarnation).toBe(admitted.commit.incarnation);
    expect(commit.pending).toBe(commit.committed);
    expect(commit.committed).toBeGreaterThanOrEqual(admitted.commit.pending);
  });

  it("reports another incarnation after a crash, and applies once a settlement sent again", async () => {
    const { id, stub, secretHash } = await newKey({ concurrency: 2 });
    expect((await stub.admit({ ...keyRequest(secretHash), requestId: "a" })).ok).toBe(true);
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    // The settlement of `a` rides on a refused admit, written behind; the account crashes
    // before committing it.
    const usage = { prompt_tokens: 10, completion_tokens: 5 };
    const stamps: CommitStamp[] = [];
    await expect(
      runInDurableObject(stub, async (instance: KeyAccount, state) => {
        const carried = await instance.admit({
          ...refusedRequest(secretHash, "b"),
          settle: [{ requestId: "a", outcome: "ok", usage }],
        });
        stamps.push(carried.commit);
        state.abort("crash inside the write window");
      }),
    ).rejects.toThrow("crash inside the write window");
    const [before] = stamps;
    expect(before?.pending).toBe((before?.committed ?? 0) + 1);

    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    const after = await again.admit(refusedRequest(secretHash, "probe"));
    expect(after.commit.incarnation).not.toBe(before?.incarnation);
    expect(after.commit.committed).toBe(0);
    // `a` is open again; sent again, it is settled, and a third time changes nothing.
    expect(await again.record({ requestId: "a" })).toMatchObject({ record: { state: "open" } });
    const settlement = { requestId: "a", outcome: "ok" as const, usage };
    expect(await again.settle(settlement)).toMatchObject({ settled: true, usedTokens: 15 });
    expect(await again.settle(settlement)).toMatchObject({ reason: "already_settled" });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ model: "m", requests: 1, promptTokens: 10, completionTokens: 5 }],
    });
  });
});
