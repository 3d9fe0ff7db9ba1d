/**
 * A team account's SQLite tables and the memory ahead of them (docs/key-account.md,
 * "Teams"): the record, the team's two buckets, settled spend per budget period, and what
 * each member key holds of its allowance. Every change commits before the call answers.
 */
import { type PeriodSpend, type SpendState } from "../key-account/budgets.ts";
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
];

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
  budget_day_micros: number | null;
  budget_month_micros: number | null;
  credit_micros: number | null;
  models: string | null;
  tags: string;
  metadata: string;
  created_at: number;
  updated_at: number;
  version: number;
};

/** One team's state, memory in step with SQLite. */
export class TeamStore {
  readonly #storage: DurableObjectStorage;
  #record: TeamRecord | null = null;
  readonly #buckets = new Map<string, BucketState>();
  readonly #settled = new Map<string, bigint>();
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
    this.#settled.clear();
    this.#members.clear();
    const row = sql.exec<RecordRow>("SELECT * FROM team_record").toArray()[0];
    this.#record = row === undefined ? null : recordOf(row);
    for (const b of sql.exec<{ kind: string; level: number; updated_at: number }>(
      "SELECT * FROM buckets",
    )) {
      this.#buckets.set(b.kind, { level: b.level, updatedAt: b.updated_at });
    }
    for (const s of sql.exec<{ period: string; settled_micros: number; settled_picos: number }>(
      "SELECT * FROM spend",
    )) {
      this.#settled.set(s.period, storedPicos(s.settled_micros, s.settled_picos));
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
      updatedAt: input.now,
      version: current.version + 1,
    });
    return this.#record;
  }

  /** The team's bucket of `kind`, full when never used. */
  bucket(kind: "requests" | "tokens", capacity: number, now: number): BucketState {
    return this.#buckets.get(kind) ?? fullBucket(capacity, now);
  }

  /** Settled spend of the day's, its month's and the lifetime periods, with what members hold. */
  spendOf(day: string): SpendState {
    const reserved = [...this.#members.values()].reduce((sum, m) => sum + m.picos, 0n);
    const period = (name: string): PeriodSpend => ({
      settledPicos: this.#settled.get(name) ?? 0n,
      reservedPicos: reserved,
    });
    return {
      day: period(`d:${day}`),
      month: period(`m:${day.slice(0, 7)}`),
      lifetime: period("all"),
    };
  }

  /** Concurrency slots held by member keys. */
  slotsHeld(): number {
    return [...this.#members.values()].reduce((sum, m) => sum + m.slots, 0);
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
    settled: { day: string; picos: bigint };
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
      if (settled.picos !== 0n) {
        for (const period of [`d:${settled.day}`, `m:${settled.day.slice(0, 7)}`, "all"]) {
          const next = (this.#settled.get(period) ?? 0n) + settled.picos;
          this.#settled.set(period, next);
          sql.exec("INSERT OR REPLACE INTO spend VALUES (?, ?, ?)", period, ...picosColumns(next));
        }
      }
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

  /** Settled spend of every stored period. */
  periods(): Map<string, bigint> {
    return this.#settled;
  }

  #write(record: TeamRecord): void {
    const { limits, budgets } = record;
    this.#storage.sql.exec(
      `INSERT OR REPLACE INTO team_record VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      record.id,
      record.name,
      limits.rpm,
      limits.tpm,
      limits.concurrency,
      budgets.dayMicros,
      budgets.monthMicros,
      budgets.creditMicros,
      modelsColumn(record.models),
      JSON.stringify(record.tags),
      JSON.stringify(record.metadata),
      record.createdAt,
      record.updatedAt,
      record.version,
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
      dayMicros: row.budget_day_micros,
      monthMicros: row.budget_month_micros,
      creditMicros: row.credit_micros,
    },
    models: row.models === null ? null : (JSON.parse(row.models) as string[]),
    tags: JSON.parse(row.tags) as string[],
    metadata: JSON.parse(row.metadata) as Record<string, MetadataValue>,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    version: row.version,
  };
}

function parseAllowance(text: string): TeamAllowance {
  const stored = JSON.parse(text) as Omit<TeamAllowance, "picos"> & { picos: string };
  return { ...stored, picos: BigInt(stored.picos) };
}
