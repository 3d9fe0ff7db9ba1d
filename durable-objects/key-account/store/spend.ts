/**
 * Spend per scope and UTC hour (table `spend_hours`) and over the lifetime (table `spend`),
 * summed per budget window, and usage per day and model (table `usage_daily`), loaded on
 * first use and written behind: what budgets are checked against and what `/v1/usage`
 * reports (docs/key-account.md, "Storage").
 */
import type { WriteBehind } from "../../write-behind.ts";
import {
  type BudgetWindow,
  LONGEST_PERIOD_HOURS,
  hourOf,
} from "../../../contracts/budget-periods.ts";
import { type BudgetLine, type PeriodSpend, budgetLines } from "../budgets.ts";
import type { UsageDelta } from "../ledger.ts";
import { type UsageDbRow, picosColumns, storedPicos, usageRowOf } from "../schema.ts";
import type { Budgets } from "../budget-types.ts";
import type { UsageRow, UsageTotals } from "../usage-types.ts";

// Spend hours this far back are no longer needed for any budget (the longest period, and
// late settlements of its window's requests).
const SPEND_RETENTION_HOURS = 2 * LONGEST_PERIOD_HOURS;

const NOTHING: PeriodSpend = { settledPicos: 0n, reservedPicos: 0n };

type SpendDbRow = {
  settled_micros: number;
  settled_picos: number;
  reserved_micros: number;
  reserved_picos: number;
};

/** The key's spend and usage rollups, memory ahead of SQLite. */
export class SpendStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  // Loaded on first use and dropped at pruning, so they stay small: spend by scope and UTC
  // hour, the sums of the budget windows asked for (kept in step with every addition), the
  // lifetime spend, usage by day and model.
  readonly #hours = new Map<string, PeriodSpend>();
  readonly #windows = new Map<
    string,
    { scope: string; window: BudgetWindow; spend: PeriodSpend }
  >();
  #lifetime: PeriodSpend | null = null;
  // The hours whose settled spend changed since `takeSettledHours`: where soft limits may
  // have been crossed.
  readonly #settledHours = new Set<number>();
  readonly #rollups = new Map<string, UsageTotals>();

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /**
   * The budgets in force at `at` with the spend of their windows: the key's (`scope`
   * `key`), or an end user's (`u:<subject>`, whose budgets have no credit).
   */
  lines(budgets: Budgets, at: number, scope: string): BudgetLine[] {
    return budgetLines(
      budgets,
      at,
      (window) => this.#window(scope, window),
      () => this.#lifetimeSpend(),
    );
  }

  /**
   * Adds to the spend of a UTC hour (negative releases): the key's and its lifetime, and the
   * end user's when `subject` is given.
   */
  add(hour: number, delta: PeriodSpend, subject: string | null = null): void {
    if (delta.settledPicos === 0n && delta.reservedPicos === 0n) return;
    if (delta.settledPicos !== 0n) this.#settledHours.add(hour);
    this.#addHour("key", hour, delta);
    if (subject !== null) this.#addHour(`u:${subject}`, hour, delta);
    const lifetime = plus(this.#lifetimeSpend(), delta);
    this.#lifetime = lifetime;
    this.#writes.set("spend:all", () =>
      this.#sql.exec(
        `INSERT INTO spend (period, settled_micros, settled_picos, reserved_micros,
           reserved_picos) VALUES ('all', ?, ?, ?, ?)
         ON CONFLICT (period) DO UPDATE SET settled_micros = excluded.settled_micros,
           settled_picos = excluded.settled_picos, reserved_micros = excluded.reserved_micros,
           reserved_picos = excluded.reserved_picos`,
        ...picosColumns(lifetime.settledPicos),
        ...picosColumns(lifetime.reservedPicos),
      ),
    );
  }

  /** The lifetime spend: every settled cost and every open reservation. */
  lifetime(): PeriodSpend {
    return this.#lifetimeSpend();
  }

  /** The UTC hours whose settled spend changed since the last call. */
  takeSettledHours(): number[] {
    const hours = [...this.#settledHours];
    this.#settledHours.clear();
    return hours;
  }

  #addHour(scope: string, hour: number, delta: PeriodSpend): void {
    const key = `${scope}\n${hour}`;
    const next = plus(this.#hours.get(key) ?? this.#hourRow(scope, hour), delta);
    this.#hours.set(key, next);
    for (const sum of this.#windows.values()) {
      if (sum.scope !== scope) continue;
      if (hour < sum.window.startHour || hour >= sum.window.endHour) continue;
      sum.spend = plus(sum.spend, delta);
    }
    this.#writes.set(`spend:${key}`, () =>
      this.#sql.exec(
        `INSERT INTO spend_hours (scope, hour, settled_micros, settled_picos, reserved_micros,
           reserved_picos) VALUES (?, ?, ?, ?, ?, ?)
         ON CONFLICT (scope, hour) DO UPDATE SET settled_micros = excluded.settled_micros,
           settled_picos = excluded.settled_picos, reserved_micros = excluded.reserved_micros,
           reserved_picos = excluded.reserved_picos`,
        scope,
        hour,
        ...picosColumns(next.settledPicos),
        ...picosColumns(next.reservedPicos),
      ),
    );
  }

  /** Adds to one model's usage of a UTC day. */
  addUsage(day: string, delta: UsageDelta): void {
    const { model, tokens } = delta;
    const key = `${day}\n${model}`;
    const current = this.#rollups.get(key) ?? this.#rollup(day, model);
    const next: UsageTotals = {
      requests: current.requests + delta.requests,
      promptTokens: current.promptTokens + (tokens?.promptTokens ?? 0),
      cachedTokens:
        current.cachedTokens +
        (tokens === null ? 0 : Math.min(tokens.cachedTokens, tokens.promptTokens)),
      completionTokens: current.completionTokens + (tokens?.completionTokens ?? 0),
      costPicos: current.costPicos + delta.costPicos,
    };
    this.#rollups.set(key, next);
    this.#writes.set(`usage:${key}`, () =>
      this.#sql.exec(
        `INSERT INTO usage_daily (day, model, requests, prompt_tokens, cached_tokens,
           completion_tokens, cost_micros, cost_picos) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (day, model) DO UPDATE SET requests = excluded.requests,
           prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens,
           completion_tokens = excluded.completion_tokens, cost_micros = excluded.cost_micros,
           cost_picos = excluded.cost_picos`,
        day,
        model,
        next.requests,
        next.promptTokens,
        next.cachedTokens,
        next.completionTokens,
        ...picosColumns(next.costPicos),
      ),
    );
  }

  /** Usage rows by day and model from `from` to `to` (UTC days, inclusive); a flush first. */
  usage(from: string, to: string): UsageRow[] {
    this.#writes.flush();
    return this.#sql
      .exec<UsageDbRow>(
        `SELECT day, model, requests, prompt_tokens, cached_tokens, completion_tokens,
           cost_micros, cost_picos
         FROM usage_daily WHERE day >= ? AND day <= ? ORDER BY day, model`,
        from,
        to,
      )
      .toArray()
      .map(usageRowOf);
  }

  /** Deletes the spend hours no budget needs any more; the caller flushed. */
  prune(now: number): void {
    this.#sql.exec("DELETE FROM spend_hours WHERE hour < ?", hourOf(now) - SPEND_RETENTION_HOURS);
    // Loaded again, on first use, from what is left.
    this.#hours.clear();
    this.#windows.clear();
    this.#lifetime = null;
    this.#rollups.clear();
  }

  // A window's spend: summed from SQLite the first time (after a flush, so the sum holds
  // every hour memory holds), then kept in step by every addition.
  #window(scope: string, window: BudgetWindow): PeriodSpend {
    const key = `${scope}\n${window.startHour}\n${window.endHour}`;
    const cached = this.#windows.get(key);
    if (cached !== undefined) return cached.spend;
    this.#writes.flush();
    const row = this.#sql
      .exec<SpendDbRow>(
        `SELECT COALESCE(SUM(settled_micros), 0) AS settled_micros,
           COALESCE(SUM(settled_picos), 0) AS settled_picos,
           COALESCE(SUM(reserved_micros), 0) AS reserved_micros,
           COALESCE(SUM(reserved_picos), 0) AS reserved_picos
         FROM spend_hours WHERE scope = ? AND hour >= ? AND hour < ?`,
        scope,
        window.startHour,
        window.endHour,
      )
      .one();
    const spend = spendOf(row);
    this.#windows.set(key, { scope, window, spend });
    return spend;
  }

  // One hour's spend, from SQLite (not yet in memory).
  #hourRow(scope: string, hour: number): PeriodSpend {
    const row = this.#sql
      .exec<SpendDbRow>(
        `SELECT settled_micros, settled_picos, reserved_micros, reserved_picos
         FROM spend_hours WHERE scope = ? AND hour = ?`,
        scope,
        hour,
      )
      .toArray()[0];
    return row === undefined ? NOTHING : spendOf(row);
  }

  #lifetimeSpend(): PeriodSpend {
    if (this.#lifetime !== null) return this.#lifetime;
    const row = this.#sql
      .exec<SpendDbRow>(
        `SELECT settled_micros, settled_picos, reserved_micros, reserved_picos
         FROM spend WHERE period = 'all'`,
      )
      .toArray()[0];
    this.#lifetime = row === undefined ? NOTHING : spendOf(row);
    return this.#lifetime;
  }

  // One model's usage of a day, from SQLite (not yet in memory).
  #rollup(day: string, model: string): UsageTotals {
    const row = this.#sql
      .exec<UsageDbRow>(
        `SELECT day, model, requests, prompt_tokens, cached_tokens, completion_tokens, cost_micros,
           cost_picos
         FROM usage_daily WHERE day = ? AND model = ?`,
        day,
        model,
      )
      .toArray()[0];
    return {
      requests: row?.requests ?? 0,
      promptTokens: row?.prompt_tokens ?? 0,
      cachedTokens: row?.cached_tokens ?? 0,
      completionTokens: row?.completion_tokens ?? 0,
      costPicos: storedPicos(row?.cost_micros ?? 0, row?.cost_picos ?? 0),
    };
  }
}

function plus(a: PeriodSpend, b: PeriodSpend): PeriodSpend {
  return {
    settledPicos: a.settledPicos + b.settledPicos,
    reservedPicos: a.reservedPicos + b.reservedPicos,
  };
}

function spendOf(row: SpendDbRow): PeriodSpend {
  return {
    settledPicos: storedPicos(row.settled_micros, row.settled_picos),
    reservedPicos: storedPicos(row.reserved_micros, row.reserved_picos),
  };
}
