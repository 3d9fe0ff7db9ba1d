/**
 * Spend per budget period and usage per day and model, loaded on first use and written
 * behind: what budgets are checked against and what `/v1/usage` reports (docs/key-account.md).
 */
import type { PeriodSpend, SpendState } from "./budgets.ts";
import { type TokenUsage } from "../../contracts/pricing.ts";
import { type UsageDbRow, picosColumns, storedPicos } from "./schema.ts";
import type { AccountStore } from "./store.ts";
import type { UsageRow, UsageTotals } from "./types.ts";

/** Usage rows by day and model (`user`: that end user's, from the ledger); flushes first. */
export function usageRows(
  store: AccountStore,
  from: string,
  to: string,
  user: string | undefined,
): UsageRow[] {
  const input = { from, to, user };
  store.writes.flush();
  const sql = store.storage.sql;
  const cursor =
    input.user === undefined
      ? sql.exec<UsageDbRow>(
          `SELECT day, model, requests, prompt_tokens, cached_tokens, completion_tokens,
             cost_micros, cost_picos
           FROM usage_daily WHERE day >= ? AND day <= ? ORDER BY day, model`,
          input.from,
          input.to,
        )
      : sql.exec<UsageDbRow>(
          `SELECT day, model, COUNT(*) AS requests,
             COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,
             COALESCE(SUM(cached_tokens), 0) AS cached_tokens,
             COALESCE(SUM(completion_tokens), 0) AS completion_tokens,
             COALESCE(SUM(cost_micros), 0) AS cost_micros,
             COALESCE(SUM(cost_picos), 0) AS cost_picos
           FROM ledger WHERE day >= ? AND day <= ? AND end_user = ? AND state <> 'open'
           GROUP BY day, model ORDER BY day, model`,
          input.from,
          input.to,
          input.user,
        );
  const rows = cursor.toArray().map((row) => ({
    day: row.day,
    model: row.model,
    requests: row.requests,
    promptTokens: row.prompt_tokens,
    cachedTokens: row.cached_tokens,
    completionTokens: row.completion_tokens,
    costPicos: storedPicos(row.cost_micros, row.cost_picos),
  }));
  return rows;
}

export function spendOf(store: AccountStore, day: string): SpendState {
  return {
    day: periodSpend(store, `d:${day}`),
    month: periodSpend(store, `m:${day.slice(0, 7)}`),
    lifetime: periodSpend(store, "all"),
  };
}

// A period's spend, from SQLite the first time.
export function periodSpend(store: AccountStore, period: string): PeriodSpend {
  const cached = store.periods.get(period);
  if (cached !== undefined) return cached;
  const row = store.storage.sql
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
  store.periods.set(period, spend);
  return spend;
}

// Adds to the day's, its month's and the lifetime spend (negative releases).
export function addSpend(store: AccountStore, day: string, delta: PeriodSpend): void {
  if (delta.settledPicos === 0n && delta.reservedPicos === 0n) return;
  for (const period of [`d:${day}`, `m:${day.slice(0, 7)}`, "all"]) {
    const current = periodSpend(store, period);
    const next = {
      settledPicos: current.settledPicos + delta.settledPicos,
      reservedPicos: current.reservedPicos + delta.reservedPicos,
    };
    store.periods.set(period, next);
    store.writes.set(`spend:${period}`, () =>
      store.storage.sql.exec(
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

export function addUsage(
  store: AccountStore,
  day: string,
  model: string,
  requests: number,
  tokens: TokenUsage | null,
  costPicos: bigint,
): void {
  const key = `${day}\n${model}`;
  const current = store.rollups.get(key) ?? loadRollup(store, day, model);
  const next: UsageTotals = {
    requests: current.requests + requests,
    promptTokens: current.promptTokens + (tokens?.promptTokens ?? 0),
    cachedTokens:
      current.cachedTokens +
      (tokens === null ? 0 : Math.min(tokens.cachedTokens, tokens.promptTokens)),
    completionTokens: current.completionTokens + (tokens?.completionTokens ?? 0),
    costPicos: current.costPicos + costPicos,
  };
  store.rollups.set(key, next);
  store.writes.set(`usage:${key}`, () =>
    store.storage.sql.exec(
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

export function loadRollup(store: AccountStore, day: string, model: string): UsageTotals {
  const row = store.storage.sql
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
