import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { KEY_ACCOUNT_MIGRATIONS } from "../../../durable-objects/key-account/migrations.ts";
import {
  budgetedKey,
  micros,
  newKey,
  openReservations,
} from "../../support/key-accounts.workers.ts";

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
        "spend_hours",
        "budget_alerts",
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
      budgets: { periods: [], creditMicros: null },
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

// The migrations that added budgets over any period, then teams (versions count from 1).
const BUDGETS_VERSION =
  KEY_ACCOUNT_MIGRATIONS.findIndex((step) => step.includes("CREATE TABLE spend_hours")) + 1;
const TEAMS_VERSION =
  KEY_ACCOUNT_MIGRATIONS.findIndex((step) => step.includes("CREATE TABLE team_pool")) + 1;

// Back to the schema before teams.
function undoTeams(sql: SqlStorage): void {
  sql.exec("DROP TABLE team_pool");
  sql.exec("ALTER TABLE key_record DROP COLUMN team_id");
  sql.exec("ALTER TABLE ledger DROP COLUMN team_id");
}

describe("KeyAccount migration to teams", () => {
  it("comes after the budgets migration, and a key and its rows start in no team", async () => {
    expect(BUDGETS_VERSION).toBeGreaterThan(1);
    expect(TEAMS_VERSION).toBe(KEY_ACCOUNT_MIGRATIONS.length);
    expect(TEAMS_VERSION).toBeGreaterThan(BUDGETS_VERSION);
    const account = await budgetedKey({});
    const { stub, id } = account;
    expect((await account.admitPriced("before")).ok).toBe(true);
    await runInDurableObject(stub, (instance: KeyAccount, state) => {
      instance.flush();
      const sql = state.storage.sql;
      sql.exec("DELETE FROM schema_migrations WHERE version >= ?", TEAMS_VERSION);
      undoTeams(sql);
    });
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.get()).toMatchObject({ teamId: null });
    expect(await again.record({ requestId: "before" })).toMatchObject({
      record: { state: "open", teamId: null },
    });
    expect((await again.settle({ requestId: "before", outcome: "ok" })).settled).toBe(true);
  });
});

describe("KeyAccount migration to budgets over any period", () => {
  it("turns a day budget into a 1d one and keeps each day's spend, exact for every window of days", async () => {
    const account = await budgetedKey({});
    const { stub, id } = account;
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    expect((await account.admitPriced("done")).ok).toBe(true);
    await stub.settle({ requestId: "done", outcome: "ok", usage });
    expect((await account.admitPriced("open")).ok).toBe(true);
    const day = new Date().toISOString().slice(0, 10);
    // Back to the version before: a day and a month budget, spend per day and month.
    await runInDurableObject(stub, (instance: KeyAccount, state) => {
      instance.flush();
      const sql = state.storage.sql;
      sql.exec("DELETE FROM schema_migrations WHERE version >= ?", BUDGETS_VERSION);
      undoTeams(sql);
      sql.exec("DROP TABLE spend_hours");
      sql.exec("DROP TABLE budget_alerts");
      for (const column of ["budgets", "model_limits", "alert_webhook_url"]) {
        sql.exec(`ALTER TABLE key_record DROP COLUMN ${column}`);
      }
      sql.exec("ALTER TABLE key_record ADD COLUMN budget_day_micros INTEGER");
      sql.exec("ALTER TABLE key_record ADD COLUMN budget_month_micros INTEGER");
      sql.exec("UPDATE key_record SET budget_day_micros = 5000");
      for (const table of ["ledger", "leases", "batch_holds"]) {
        sql.exec(`ALTER TABLE ${table} DROP COLUMN hour`);
      }
      for (const period of [`d:${day}`, `m:${day.slice(0, 7)}`]) {
        sql.exec(
          `INSERT INTO spend (period, settled_micros, settled_picos, reserved_micros, reserved_picos)
           VALUES (?, 420, 0, 750, 0)`,
          period,
        );
      }
    });
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect((await again.get())?.budgets).toEqual({
      periods: [{ period: "1d", limitMicros: 5_000, softMicros: null }],
      creditMicros: null,
    });
    expect(await again.budgetStatus()).toEqual([
      expect.objectContaining({
        budget: "1d",
        spentPicos: micros(420),
        reservedPicos: micros(750),
        resetsAt: Date.parse(day) + 86_400_000,
      }),
    ]);
    // The open request's reservation is released from the hour it was migrated to.
    await again.settle({ requestId: "open", outcome: "ok", usage });
    expect(await again.budgetStatus()).toEqual([
      expect.objectContaining({ spentPicos: micros(840), reservedPicos: 0n }),
    ]);
  });
});
