import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { Budgets } from "../../../durable-objects/key-account/budget-types.ts";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { mintApiKey, newKeyId } from "../../../functions/accounts/keys.ts";

// $0.02 per million tokens: 20,000 pico-dollars a token.
const EMBED = {
  inputMicrosPerMtok: 20_000,
  cachedInputMicrosPerMtok: 20_000,
  outputMicrosPerMtok: 0,
};
const TEN_TOKENS = { prompt_tokens: 10, completion_tokens: 0 };

async function newAccount(budgets: Partial<Budgets> = {}) {
  const id = newKeyId();
  const { secretHash } = await mintApiKey(env, id);
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
  await stub.create({
    id,
    name: "exact",
    secretHash,
    limits: { rpm: 100_000, tpm: 100_000_000, concurrency: 100 },
    budgets: { periods: [], creditMicros: null, ...budgets },
    allowedOrigins: [],
    models: null,
    tier: "standard",
    expiresAt: null,
    now: Date.now(),
  });
  // One prompt token estimated: 34 reserved, 680,000 pico-dollars at most.
  const admit = (requestId: string) =>
    stub.admit({
      requestId,
      credential: { kind: "key", secretHash },
      model: "embed",
      promptTokens: 1,
      maxTokens: 0,
      price: EMBED,
    });
  return { id, stub, admit };
}

describe("KeyAccount amounts below a micro-dollar", () => {
  it("adds up a hundred requests of a fifth of a micro-dollar to the pico-dollar, across a restart", async () => {
    const { id, stub, admit } = await newAccount();
    for (let i = 0; i < 100; i++) {
      expect(await admit(`r${i}`)).toMatchObject({ ok: true, reservedPicos: 680_000n });
      expect(
        await stub.settle({ requestId: `r${i}`, outcome: "ok", usage: TEN_TOKENS }),
      ).toMatchObject({ settled: true, costPicos: 200_000n });
    }
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ model: "embed", requests: 100, promptTokens: 1_000, costPicos: 20_000_000n }],
    });
    expect(await again.record({ requestId: "r0" })).toMatchObject({
      record: { state: "settled", costPicos: 200_000n, reservedPicos: 680_000n },
    });
    const spend = await runInDurableObject(again, (_instance: KeyAccount, state) => {
      const columns =
        "SUM(settled_micros) AS settled_micros, SUM(settled_picos) AS settled_picos, SUM(reserved_micros) AS reserved_micros, SUM(reserved_picos) AS reserved_picos";
      const sql = state.storage.sql;
      return [
        ...sql.exec(`SELECT ${columns} FROM spend`).toArray(),
        ...sql.exec(`SELECT ${columns} FROM spend_hours`).toArray(),
      ];
    });
    // The lifetime and the hours: $0.00002 settled, nothing left reserved.
    expect(spend).toEqual(
      Array.from({ length: 2 }, () => ({
        settled_micros: 20,
        settled_picos: 0,
        reserved_micros: 0,
        reserved_picos: 0,
      })),
    );
    const [series] = (await again.metrics()).series;
    expect(series?.spendPicos).toBe(20_000_000);
  });

  it("spends a one micro-dollar credit to the pico-dollar and not beyond", async () => {
    const { stub, admit } = await newAccount({ creditMicros: 1 });
    // 680,000 reserved while 200,000 settle each: two fit, the third's worst case does not.
    for (const requestId of ["a", "b"]) {
      expect((await admit(requestId)).ok).toBe(true);
      await stub.settle({ requestId, outcome: "ok", usage: TEN_TOKENS });
    }
    expect(await admit("c")).toMatchObject({
      code: "insufficient_quota",
      budget: "credit",
      limitPicos: 1_000_000n,
      spentPicos: 400_000n,
      reservedPicos: 0n,
      requestedPicos: 680_000n,
    });
  });

  it("bills a request above its reservation only up to the credit's last pico-dollar", async () => {
    const { stub, admit } = await newAccount({ creditMicros: 1 });
    expect((await admit("big")).ok).toBe(true);
    // 100 tokens cost 2,000,000: the reservation and the 320,000 of room left, no more.
    expect(
      await stub.settle({
        requestId: "big",
        outcome: "ok",
        usage: { prompt_tokens: 100, completion_tokens: 0 },
      }),
    ).toMatchObject({ costPicos: 1_000_000n });
    expect(await admit("next")).toMatchObject({
      code: "insufficient_quota",
      spentPicos: 1_000_000n,
    });
  });
});

describe("KeyAccount schema migration to pico-dollars", () => {
  it("keeps the micro-dollar amounts of version 6 exactly, metrics included", async () => {
    const { id, stub, admit } = await newAccount();
    expect((await admit("old")).ok).toBe(true);
    await stub.settle({
      requestId: "old",
      outcome: "ok",
      usage: { prompt_tokens: 100, completion_tokens: 0 },
    });
    // Back to version 6: amounts in whole micro-dollars only.
    await runInDurableObject(stub, (instance: KeyAccount, state) => {
      instance.flush();
      const sql = state.storage.sql;
      for (const [table, columns] of [
        ["ledger", ["reserved_picos", "cost_picos"]],
        ["usage_daily", ["cost_picos"]],
        ["spend", ["settled_picos", "reserved_picos"]],
      ] as const) {
        for (const column of columns) sql.exec(`ALTER TABLE ${table} DROP COLUMN ${column}`);
      }
      const [series] = sql
        .exec<{ name: string; data: string }>(
          "SELECT name, data FROM metrics WHERE name <> 'errors'",
        )
        .toArray();
      const { spendPicos: _picos, ...rest } = JSON.parse(series?.data ?? "{}") as Record<
        string,
        unknown
      >;
      sql.exec(
        "UPDATE metrics SET data = ? WHERE name = ?",
        JSON.stringify({ ...rest, spendMicros: 2 }),
        series?.name ?? "",
      );
      sql.exec("DELETE FROM schema_migrations WHERE version >= 7");
      // What the later migrations added.
      sql.exec("DROP TABLE leases");
      sql.exec("DROP TABLE batch_holds");
      sql.exec("DROP TABLE team_pool");
      sql.exec("ALTER TABLE ledger DROP COLUMN team_id");
      for (const column of ["blocked_at", "tags", "metadata", "team_id"]) {
        sql.exec(`ALTER TABLE key_record DROP COLUMN ${column}`);
      }
      sql.exec("DROP INDEX ledger_created");
      for (const column of ["tags", "http_status", "duration_ms", "ttft_ms"]) {
        sql.exec(`ALTER TABLE ledger DROP COLUMN ${column}`);
      }
      sql.exec("ALTER TABLE ledger DROP COLUMN cache_hit");
      // Budgets over any period.
      sql.exec("DROP TABLE spend_hours");
      sql.exec("DROP TABLE budget_alerts");
      for (const column of ["budgets", "model_limits", "alert_webhook_url"]) {
        sql.exec(`ALTER TABLE key_record DROP COLUMN ${column}`);
      }
      sql.exec("ALTER TABLE key_record ADD COLUMN budget_day_micros INTEGER");
      sql.exec("ALTER TABLE key_record ADD COLUMN budget_month_micros INTEGER");
      sql.exec("ALTER TABLE ledger DROP COLUMN hour");
    });
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.record({ requestId: "old" })).toMatchObject({
      record: { costPicos: 2_000_000n, reservedPicos: 0n },
    });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ requests: 1, costPicos: 2_000_000n }],
    });
    expect((await again.metrics()).series[0]).toMatchObject({ spendPicos: 2_000_000 });
    expect((await again.metrics()).series[0]).not.toHaveProperty("spendMicros");
    // Billing goes on from there, to the pico-dollar.
    expect((await admit("new")).ok).toBe(true);
    await again.settle({ requestId: "new", outcome: "ok", usage: TEN_TOKENS });
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ requests: 2, costPicos: 2_200_000n }],
    });
  });
});
