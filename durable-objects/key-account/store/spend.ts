/**
 * Spend per budget period (table `spend`) and usage per day and model (table
 * `usage_daily`), loaded on first use and written behind: what budgets are checked against
 * and what `/v1/usage` reports (docs/key-account.md, "Storage").
 */
import type { WriteBehind } from "../../write-behind.ts";
import { utcDay, utcMonth } from "../../../contracts/pricing.ts";
import type { PeriodSpend, SpendState } from "../budgets.ts";
import type { UsageDelta } from "../ledger.ts";
import { type UsageDbRow, picosColumns, storedPicos, usageRowOf } from "../schema.ts";
import type { UsageRow, UsageTotals } from "../usage-types.ts";

// Spend rows of days and months this far back are no longer needed for any budget.
const SPEND_RETENTION_MS = 62 * 86_400_000;

/** The key's spend and usage rollups, memory ahead of SQLite. */
export class SpendStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  // Loaded on first use and dropped at pruning, so they stay small: spend by period
  // ('d:YYYY-MM-DD', 'm:YYYY-MM', 'all'), usage by day and model.
  readonly #periods = new Map<string, PeriodSpend>();
  readonly #rollups = new Map<string, UsageTotals>();

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** The spend of a UTC day, its month and the lifetime. */
  of(day: string): SpendState {
    return {
      day: this.#period(`d:${day}`),
      month: this.#period(`m:${day.slice(0, 7)}`),
      lifetime: this.#period("all"),
    };
  }

  /** Adds to the day's, its month's and the lifetime spend (negative releases). */
  add(day: string, delta: PeriodSpend): void {
    if (delta.settledPicos === 0n && delta.reservedPicos === 0n) return;
    for (const period of [`d:${day}`, `m:${day.slice(0, 7)}`, "all"]) {
      const current = this.#period(period);
      const next = {
        settledPicos: current.settledPicos + delta.settledPicos,
        reservedPicos: current.reservedPicos + delta.reservedPicos,
      };
      this.#periods.set(period, next);
      this.#writes.set(`spend:${period}`, () =>
        this.#sql.exec(
          `INSERT INTO spend (period, settled_micros, settled_picos, reserved_micros,
             reserved_picos) VALUES (?, ?, ?, ?, ?)
           ON CONFLICT (period) DO UPDATE SET settled_micros = excluded.settled_micros,
             settled_picos = excluded.settled_picos, reserved_micros = excluded.reserved_micros,
             reserved_picos = excluded.reserved_picos`,
          period,
          ...picosColumns(next.settledPicos),
          ...picosColumns(next.reservedPicos),
        ),
      );
    }
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

  /** Deletes the spend rows no budget needs any more; the caller flushed. */
  prune(now: number): void {
    const old = now - SPEND_RETENTION_MS;
    this.#sql.exec(
      "DELETE FROM spend WHERE (period LIKE 'd:%' AND period < ?) OR (period LIKE 'm:%' AND period < ?)",
      `d:${utcDay(old)}`,
      `m:${utcMonth(old)}`,
    );
    // Loaded again, on first use, from what is left.
    this.#periods.clear();
    this.#rollups.clear();
  }

  // A period's spend, from SQLite the first time.
  #period(period: string): PeriodSpend {
    const cached = this.#periods.get(period);
    if (cached !== undefined) return cached;
    const row = this.#sql
      .exec<{
        settled_micros: number;
        settled_picos: number;
        reserved_micros: number;
        reserved_picos: number;
      }>(
        `SELECT settled_micros, settled_picos, reserved_micros, reserved_picos
         FROM spend WHERE period = ?`,
        period,
      )
      .toArray()[0];
    const spend = {
      settledPicos: storedPicos(row?.settled_micros ?? 0, row?.settled_picos ?? 0),
      reservedPicos: storedPicos(row?.reserved_micros ?? 0, row?.reserved_picos ?? 0),
    };
    this.#periods.set(period, spend);
    return spend;
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
