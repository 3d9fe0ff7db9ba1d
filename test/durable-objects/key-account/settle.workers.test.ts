import { runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { RESERVATION_LEASE_MS } from "../../../durable-objects/key-account/types.ts";
import { newKey, openReservations } from "../../support/key-accounts.workers.ts";

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
    // The alarm is due at once and runs by itself, maybe not yet: run it here as well (safe
    // to run twice), since a runDurableObjectAlarm that finds it already dispatched does not.
    await runInDurableObject(stub, (instance: KeyAccount) => instance.alarm());
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
