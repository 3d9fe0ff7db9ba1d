/**
 * The contract of budgets and per-model limits (docs/key-account.md, "Budgets"): what a key
 * (or an end user's token) sets and what the account answers about them. The edge imports
 * this file; so may any other owner of budgets.
 */

/** Which budget: its period (`1h`, `7d`, `month`…), or `credit` (the lifetime credit). */
export type BudgetName = string;

/**
 * A budget over a recurring period (`contracts/budget-periods.ts`: `1h`, `7d`, `month`…) in
 * whole micro-dollars; `softMicros` (below the limit, or null) alerts and never refuses.
 */
export interface PeriodBudget {
  period: string;
  limitMicros: number;
  softMicros: number | null;
}

/** Spending limits in micro-dollars: any number of periods, and a lifetime credit (null: none). */
export interface Budgets {
  periods: PeriodBudget[];
  creditMicros: number | null;
}

/** A key's own requests-per-minute and tokens-per-minute limits for one model. */
export interface ModelLimits {
  rpm: number | null;
  tpm: number | null;
}

/** One budget as it stands now: its window, its spend, when it resets (amounts in pico-dollars). */
export interface BudgetStatus {
  /** The period, or `credit`. */
  budget: BudgetName;
  limitPicos: bigint;
  softPicos: bigint | null;
  spentPicos: bigint;
  reservedPicos: bigint;
  /** The window's first instant and its end (epoch ms); null for the credit. */
  startsAt: number | null;
  resetsAt: number | null;
}

/** No spending limit at all. */
export const NO_BUDGETS: Budgets = { periods: [], creditMicros: null };
