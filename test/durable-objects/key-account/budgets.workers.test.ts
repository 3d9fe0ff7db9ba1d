import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { RESERVATION_LEASE_MS } from "../../../durable-objects/key-account/types.ts";
import { hourOf } from "../../../contracts/budget-periods.ts";
import {
  micros,
  PRICE,
  PRICIER,
  budgetedKey,
  periods,
  spend,
} from "../../support/key-accounts.workers.ts";

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
    expect(await spend(stub, `h:${hourOf(Date.now())}`)).toEqual({
      settled: micros(420),
      reserved: 0n,
    });
    expect(await stub.usage({ from: day, to: day })).toMatchObject({
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
    const { admitPriced } = await budgetedKey(periods(["1d", 1_000]));
    expect((await admitPriced("r1")).ok).toBe(true);
    expect(await admitPriced("r2")).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      budget: "1d",
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
    const { admitPriced, stub } = await budgetedKey(periods(["1d", 750]));
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
    // Due at once: run here, whether or not it has begun by itself (safe to run twice).
    await runInDurableObject(stub, (instance: KeyAccount) => instance.alarm());
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
