/**
 * A team account's SQLite tables and the memory ahead of them (docs/key-account.md,
 * "Teams"): the record, the team's two buckets, settled spend per UTC hour and over the
 * lifetime, and what each member key holds of its allowance (its alerts: alerts.ts). Every
 * change commits before the call answers.
 */
import { type BudgetLine, type PeriodSpend, budgetLines } from "../key-account/budgets.ts";
import { type BudgetWindow, LONGEST_PERIOD_HOURS } from "../../contracts/budget-periods.ts";
import type { Budgets, PeriodBudget } from "../key-account/budget-types.ts";
import { type BucketState, fullBucket } from "../key-account/token-bucket.ts";
import { modelsColumn, picosColumns, storedPicos } from "../key-account/schema.ts";
import type { MetadataValue } from "../../contracts/tags.ts";
import type { TeamAllowance, TeamCreateInput, TeamRecord, TeamUpdateInput } from "./types.ts";

/** The migrations of a team account, in order. */
export const TEAM_ACCOUNT_MIGRATIONS: readonly string[] = [
  `CREATE TABLE team_record (
     singleton INTEGER PRIMARY KEY CHECK (singleton = 1), id TEXT NOT NULL, name TEXT NOT NULL,
     rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, concurrency INTEGER NOT NULL,
     budget_day_micros INTEGER, budget_month_micros INTEGER, credit_micros INTEGER,
     models TEXT, tags TEXT NOT NULL, metadata TEXT NOT NULL, created_at INTEGER NOT NULL,
     updated_at INTEGER NOT NULL, version INTEGER NOT NULL);
   CREATE TABLE buckets (kind TEXT PRIMARY KEY, level REAL NOT NULL, updated_at INTEGER NOT NULL);
   CREATE TABLE spend (
     period TEXT PRIMARY KEY, settled_micros INTEGER NOT NULL, settled_picos INTEGER NOT NULL);
   CREATE TABLE members (
     key_id TEXT PRIMARY KEY, picos_micros INTEGER NOT NULL, picos_picos INTEGER NOT NULL,
     slots INTEGER NOT NULL, seq INTEGER NOT NULL, answer TEXT NOT NULL);`,
  // Budgets over any period (a list, as a key's) and settled spend per UTC hour; what was
  // spent on a day before counts in its first hour.
  `ALTER TABLE team_record ADD COLUMN budgets TEXT NOT NULL DEFAULT '[]';
   UPDATE team_record SET budgets = json_array(
     json_object('period', '1d', 'limitMicros', budget_day_micros, 'softMicros', NULL),
     json_object('period', 'month', 'limitMicros', budget_month_micros, 'softMicros', NULL));
   UPDATE team_record SET budgets = json_remove(budgets, '$[1]') WHERE budget_month_micros IS NULL;
   UPDATE team_record SET budgets = json_remove(budgets, '$[0]') WHERE budget_day_micros IS NULL;
   ALTER TABLE team_record DROP COLUMN budget_day_micros;
   ALTER TABLE team_record DROP COLUMN budget_month_micros;
   CREATE TABLE spend_hours (hour INTEGER PRIMARY KEY, settled_micros INTEGER NOT NULL,
     settled_picos INTEGER NOT NULL);
   INSERT INTO spend_hours SELECT CAST(strftime('%s', substr(period, 3)) AS INTEGER) / 3600,
     settled_micros, settled_picos FROM spend WHERE period LIKE 'd:%';
   DELETE FROM spend WHERE period <> 'all';`,
  // Soft-budget alerts (as a key's) and where they go.
  `ALTER TABLE team_record ADD COLUMN alert_webhook_url TEXT;
   CREATE TABLE budget_alerts (
     alert_id TEXT PRIMARY KEY, scope TEXT NOT NULL, period TEXT NOT NULL,
     window_start INTEGER NOT NULL, body TEXT NOT NULL, url TEXT, attempts INTEGER NOT NULL,
     next_at INTEGER, delivered_at INTEGER, created_at INTEGER NOT NULL);
   CREATE TABLE alert_counts (period TEXT NOT NULL, outcome TEXT NOT NULL,
     count INTEGER NOT NULL, PRIMARY KEY (period, outcome));`,
];

// Spend hours this far back are no longer needed for any budget.
const SPEND_RETENTION_HOURS = 2 * LONGEST_PERIOD_HOURS;

/** What one member key holds of the team's allowance, and what its last call was granted. */
export interface MemberHold {
  picos: bigint;
  slots: number;
  seq: number;
  granted: TeamAllowance;
}

type RecordRow = {
  id: string;
  name: string;
  rpm: number;
  tpm: number;
  concurrency: number;
  budgets: string;
  credit_micros: number | null;
  models: string | null;
  tags: string;
  metadata: string;
  alert_webhook_url: string | null;
  created_at: number;
  updated_at: number;
  version: number;
};

/** One team's state, memory in step with SQLite. */
export class TeamStore {
  readonly #storage: DurableObjectStorage;
  #record: TeamRecord | null = null;
  readonly #buckets = new Map<string, BucketState>();
  // Settled spend by UTC hour, and over the lifetime.
  readonly #hours = new Map<number, bigint>();
  #lifetime = 0n;
  readonly #members = new Map<string, MemberHold>();

  constructor(storage: DurableObjectStorage) {
    this.#storage = storage;
  }

  get record(): TeamRecord | null {
    return this.#record;
  }

  /** Loads every table (they are small). */
  load(): void {
    const sql = this.#storage.sql;
    this.#buckets.clear();
    this.#hours.clear();
    this.#lifetime = 0n;
    this.#members.clear();
    const row = sql.exec<RecordRow>("SELECT * FROM team_record").toArray()[0];
    this.#record = row === undefined ? null : recordOf(row);
    for (const b of sql.exec<{ kind: string; level: number; updated_at: number }>(
      "SELECT * FROM buckets",
    )) {
      this.#buckets.set(b.kind, { level: b.level, updatedAt: b.updated_at });
    }
    for (const s of sql.exec<{ settled_micros: number; settled_picos: number }>(
      "SELECT * FROM spend WHERE period = 'all'",
    )) {
      this.#lifetime = storedPicos(s.settled_micros, s.settled_picos);
    }
    for (const h of sql.exec<{ hour: number; settled_micros: number; settled_picos: number }>(
      "SELECT * FROM spend_hours",
    )) {
      this.#hours.set(h.hour, storedPicos(h.settled_micros, h.settled_picos));
    }
    for (const m of sql.exec<{
      key_id: string;
      picos_micros: number;
      picos_picos: number;
      slots: number;
      seq: number;
      answer: string;
    }>("SELECT * FROM members")) {
      this.#members.set(m.key_id, {
        picos: storedPicos(m.picos_micros, m.picos_picos),
        slots: m.slots,
        seq: m.seq,
        granted: parseAllowance(m.answer),
      });
    }
  }

  /** Creates the team; false when one lives here already. */
  create(input: TeamCreateInput): boolean {
    if (this.#record !== null) return false;
    this.#write({ ...input, createdAt: input.now, updatedAt: input.now, version: 1 });
    return true;
  }

  /** Applies a partial change; null when no team lives here. */
  update(input: TeamUpdateInput): TeamRecord | null {
    const current = this.#record;
    if (current === null) return null;
    this.#write({
      ...current,
      name: input.name ?? current.name,
      limits: { ...current.limits, ...input.limits },
      budgets: { ...current.budgets, ...input.budgets },
      models: input.models === undefined ? current.models : input.models,
      tags: input.tags ?? current.tags,
      metadata: input.metadata ?? current.metadata,
      alertWebhookUrl:
        input.alertWebhookUrl === undefined ? current.alertWebhookUrl : input.alertWebhookUrl,
      updatedAt: input.now,
      version: current.version + 1,
    });
    return this.#record;
  }

  /** The team's bucket of `kind`, full when never used. */
  bucket(kind: "requests" | "tokens", capacity: number, now: number): BucketState {
    return this.#buckets.get(kind) ?? fullBucket(capacity, now);
  }

  /**
   * The team's budgets in force at `at`, each with its window's settled spend and, as
   * reserved, all that member keys hold (which no window owns).
   */
  lines(budgets: Budgets, at: number): BudgetLine[] {
    const reservedPicos = [...this.#members.values()].reduce((sum, m) => sum + m.picos, 0n);
    const inWindow = (window: BudgetWindow): PeriodSpend => {
      let settledPicos = 0n;
      for (const [hour, picos] of this.#hours) {
        if (hour >= window.startHour && hour < window.endHour) settledPicos += picos;
      }
      return { settledPicos, reservedPicos };
    };
    return budgetLines(budgets, at, inWindow, () => ({
      settledPicos: this.#lifetime,
      reservedPicos,
    }));
  }

  /** Concurrency slots held by member keys. */
  slotsHeld(): number {
    return [...this.#members.values()].reduce((sum, m) => sum + m.slots, 0);
  }

  /** Member keys other than `except` holding any of the team's money or slots, most first. */
  holders(of: "picos" | "slots", except: string): string[] {
    const held = (m: MemberHold) => (of === "picos" ? m.picos : BigInt(m.slots));
    return [...this.#members]
      .filter(([keyId, m]) => keyId !== except && held(m) > 0n)
      .sort(([, a], [, b]) => (held(b) > held(a) ? 1 : held(b) < held(a) ? -1 : 0))
      .map(([keyId]) => keyId);
  }

  member(keyId: string): MemberHold {
    return (
      this.#members.get(keyId) ?? {
        picos: 0n,
        slots: 0,
        seq: 0,
        granted: { requests: 0, tokens: 0, picos: 0n, slots: 0 },
      }
    );
  }

  /** Commits a lease call's effects in one transaction. */
  commitLease(change: {
    keyId: string;
    member: MemberHold;
    buckets: { requests: BucketState; tokens: BucketState };
    settled: { hour: number; picos: bigint };
  }): void {
    const { keyId, member, buckets, settled } = change;
    const sql = this.#storage.sql;
    this.#storage.transactionSync(() => {
      for (const [kind, state] of Object.entries(buckets)) {
        this.#buckets.set(kind, state);
        sql.exec(
          "INSERT OR REPLACE INTO buckets (kind, level, updated_at) VALUES (?, ?, ?)",
          kind,
          state.level,
          state.updatedAt,
        );
      }
      if (settled.picos !== 0n) this.#settle(settled.hour, settled.picos);
      this.#members.set(keyId, member);
      sql.exec(
        "INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?, ?, ?)",
        keyId,
        ...picosColumns(member.picos),
        member.slots,
        member.seq,
        JSON.stringify({ ...member.granted, picos: `${member.granted.picos}` }),
      );
    });
  }

  // Adds settled spend to its UTC hour and the lifetime; hours no budget reaches any more go.
  #settle(hour: number, picos: bigint): void {
    const sql = this.#storage.sql;
    const next = (this.#hours.get(hour) ?? 0n) + picos;
    this.#hours.set(hour, next);
    sql.exec("INSERT OR REPLACE INTO spend_hours VALUES (?, ?, ?)", hour, ...picosColumns(next));
    this.#lifetime += picos;
    sql.exec("INSERT OR REPLACE INTO spend VALUES ('all', ?, ?)", ...picosColumns(this.#lifetime));
    const oldest = hour - SPEND_RETENTION_HOURS;
    for (const stored of this.#hours.keys()) if (stored < oldest) this.#hours.delete(stored);
    sql.exec("DELETE FROM spend_hours WHERE hour < ?", oldest);
  }

  #write(record: TeamRecord): void {
    const { limits, budgets } = record;
    this.#storage.sql.exec(
      `INSERT OR REPLACE INTO team_record (singleton, id, name, rpm, tpm, concurrency,
         credit_micros, models, tags, metadata, created_at, updated_at, version, budgets,
         alert_webhook_url)
       VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      record.id,
      record.name,
      limits.rpm,
      limits.tpm,
      limits.concurrency,
      budgets.creditMicros,
      modelsColumn(record.models),
      JSON.stringify(record.tags),
      JSON.stringify(record.metadata),
      record.createdAt,
      record.updatedAt,
      record.version,
      JSON.stringify(budgets.periods),
      record.alertWebhookUrl,
    );
    this.#record = record;
  }
}

function recordOf(row: RecordRow): TeamRecord {
  return {
    id: row.id,
    name: row.name,
    limits: { rpm: row.rpm, tpm: row.tpm, concurrency: row.concurrency },
    budgets: {
      periods: JSON.parse(row.budgets) as PeriodBudget[],
      creditMicros: row.credit_micros,
    },
    models: row.models === null ? null : (JSON.parse(row.models) as string[]),
    tags: JSON.parse(row.tags) as string[],
    metadata: JSON.parse(row.metadata) as Record<string, MetadataValue>,
    alertWebhookUrl: row.alert_webhook_url,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    version: row.version,
  };
}

function parseAllowance(text: string): TeamAllowance {
  const stored = JSON.parse(text) as Omit<TeamAllowance, "picos"> & { picos: string };
  return { ...stored, picos: BigInt(stored.picos) };
}
