import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { HOUR_MS, hourOf } from "../../../contracts/budget-periods.ts";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import type { AdmitResult } from "../../../durable-objects/key-account/types.ts";
import { budgetedKey, micros, newKey, periods, spend } from "../../support/key-accounts.workers.ts";

const okCount = (results: AdmitResult[]) => results.filter((result) => result.ok).length;

describe("KeyAccount budgets over any period", () => {
  it("admits exactly as many of 40 concurrent requests as a 1h budget holds", async () => {
    // Each reserves at most 750 µ$: five fit in 3,800 µ$, a sixth would not.
    const { admitPriced, stub } = await budgetedKey(periods(["1h", 3_800], ["30d", 100_000]));
    const now = Date.now();
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) => admitPriced(`r${i}`, { now })),
    );
    expect(okCount(results)).toBe(5);
    expect(results.find((result) => !result.ok)).toMatchObject({
      code: "insufficient_quota",
      budget: "1h",
      scope: "key",
      reservedPicos: micros(3_750),
    });
    expect(await spend(stub, `h:${hourOf(now)}`)).toEqual({ settled: 0n, reserved: micros(3_750) });
    const [hour, month] = await stub.budgetStatus();
    expect(hour).toMatchObject({ budget: "1h", reservedPicos: micros(3_750) });
    expect(hour?.resetsAt).toBe((hourOf(Date.now()) + 1) * HOUR_MS);
    expect(month).toMatchObject({ budget: "30d", reservedPicos: micros(3_750) });
  });

  it("counts a request's cost in the hour it was admitted: each window sums its own hours", async () => {
    const { admitPriced, stub } = await budgetedKey(periods(["1h", 1_000], ["1d", 10_000]));
    const lastHour = (hourOf(Date.now()) - 1) * HOUR_MS + 1_000;
    expect((await admitPriced("old", { now: lastHour })).ok).toBe(true);
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    expect(await stub.settle({ requestId: "old", outcome: "ok", usage })).toMatchObject({
      costPicos: micros(420),
    });
    expect(await spend(stub, `h:${hourOf(lastHour)}`)).toEqual({
      settled: micros(420),
      reserved: 0n,
    });
    // The last hour's window holds 420 µ$: 750 more would overdraw it; this hour's is empty.
    expect(await admitPriced("again-then", { now: lastHour + 1 })).toMatchObject({
      ok: false,
      budget: "1h",
      spentPicos: micros(420),
    });
    expect((await admitPriced("now")).ok).toBe(true);
    const status = await stub.budgetStatus();
    // The day's window holds both hours (unless this test straddles midnight, UTC).
    const sameDay = new Date(lastHour).getUTCDate() === new Date().getUTCDate();
    expect(status[1]).toMatchObject({
      budget: "1d",
      spentPicos: sameDay ? micros(420) : 0n,
      reservedPicos: micros(750),
    });
  });

  it("admits exactly a model's own rpm of 40 concurrent requests, and other models freely", async () => {
    const { admit, stub } = await newKey({ concurrency: 1_000 });
    await stub.update({ modelLimits: { big: { rpm: 7, tpm: null } }, now: Date.now() });
    const now = Date.now();
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) => admit(`b${i}`, { model: "big", now })),
    );
    expect(okCount(results)).toBe(7);
    expect(results.find((result) => !result.ok)).toMatchObject({
      code: "rate_limit_exceeded",
      limit: "requests",
      scope: "model",
      model: "big",
      limitValue: 7,
    });
    const others = await Promise.all(
      Array.from({ length: 40 }, (_, i) => admit(`m${i}`, { model: "m", now })),
    );
    expect(okCount(others)).toBe(40);
    // A fallback to a limited model counts against it too.
    expect(
      await admit("fallback", {
        now,
        fallbacks: [{ model: "big", maxTokens: 90, price: { ...FREE } }],
      }),
    ).toMatchObject({ ok: false, scope: "model", model: "big" });
  });

  it("gives a model's tokens back when the request used fewer than it reserved", async () => {
    const { admit, stub } = await newKey();
    await stub.update({ modelLimits: { big: { rpm: null, tpm: 250 } }, now: Date.now() });
    expect((await admit("t1", { model: "big" })).ok).toBe(true);
    expect((await admit("t2", { model: "big" })).ok).toBe(true);
    expect(await admit("t3", { model: "big" })).toMatchObject({
      ok: false,
      scope: "model",
      limit: "tokens",
    });
    const usage = { prompt_tokens: 10, completion_tokens: 5 };
    await stub.settle({ requestId: "t1", outcome: "ok", usage, model: "big" });
    expect((await admit("t4", { model: "big" })).ok).toBe(true);
  });

  it("holds each end user of browser tokens to their own budget, exactly under 40 concurrent requests", async () => {
    const { admitPriced } = await budgetedKey({});
    const now = Date.now();
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        admitPriced(`u${i}`, { now, credential: browser("user:alice") }),
      ),
    );
    expect(okCount(results)).toBe(2);
    expect(results.find((result) => !result.ok)).toMatchObject({
      code: "insufficient_quota",
      scope: "end_user",
      budget: "1d",
    });
    // Another end user, and the key itself, still have room.
    expect((await admitPriced("bob", { now, credential: browser("user:bob") })).ok).toBe(true);
    expect((await admitPriced("key", { now })).ok).toBe(true);
  });
});

// A browser token's credential for one end user, with a day budget of 2,000 µ$.
function browser(subject: string) {
  return {
    kind: "browser" as const,
    secretGeneration: 1,
    subject,
    limits: { rpm: 1_000, tpm: 10_000_000, concurrency: 100 },
    models: null,
    budgets: [{ period: "1d", limitMicros: 2_000, softMicros: null }],
  };
}

const FREE = { inputMicrosPerMtok: 0, cachedInputMicrosPerMtok: 0, outputMicrosPerMtok: 0 };

describe("KeyAccount budget store", () => {
  it("keeps the period spend of an account exactly across a restart", async () => {
    const { admitPriced, stub, id } = await budgetedKey(periods(["1h", 3_000]));
    for (let i = 0; i < 3; i++) expect((await admitPriced(`r${i}`)).ok).toBe(true);
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect((await again.budgetStatus())[0]).toMatchObject({ reservedPicos: micros(2_250) });
  });
});
