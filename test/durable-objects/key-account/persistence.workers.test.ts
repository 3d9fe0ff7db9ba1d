import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { KEY_ACCOUNT_MIGRATIONS } from "../../../durable-objects/key-account/schema.ts";
import { newKey, openReservations } from "../../support/key-accounts.workers.ts";

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

describe("KeyAccount schema migration", () => {
  it("turns version-1 reservations into ledger rows with rollups, and keeps open ones open", async () => {
    const { id, stub, secretHash } = await newKey();
    const created = Date.UTC(2026, 0, 15, 12);
    await runInDurableObject(stub, (_instance: KeyAccount, state) => {
      const sql = state.storage.sql;
      for (const table of [
        "ledger",
        "usage_daily",
        "spend",
        "metrics",
        "leases",
        "batch_holds",
        "team_pool",
      ])
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
