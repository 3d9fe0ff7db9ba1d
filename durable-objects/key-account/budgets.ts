/**
 * Budgets as pure functions: whether a key has any, the first one a reservation would
 * overdraw, and the most a settling request may be billed (docs/key-account.md).
 */
import { msToNextUtcDay, msToNextUtcMonth } from "../../contracts/pricing.ts";
import type {
  AdmissionRefusal,
  BudgetName,
  Budgets,
  PeriodSpend,
  SpendState,
} from "./admission.ts";

/** Milliseconds suggested before retrying a request refused for concurrency. */
export const CONCURRENCY_RETRY_MS = 1_000;

type QuotaRefusal = Extract<AdmissionRefusal, { code: "insufficient_quota" }>;

/** Whether a key has any budget. */
export function hasBudgets(budgets: Budgets): boolean {
  return (
    budgets.dayMicros !== null || budgets.monthMicros !== null || budgets.creditMicros !== null
  );
}

/**
 * The most a settling request may be billed without taking any budget past its limit: its
 * own reservation (agreed at admission) plus whatever room the budgets have left; null when
 * the key has no budget. `spend` includes the request's reservation while it is open.
 */
export function billingCap(
  budgets: Budgets,
  spend: SpendState,
  reservationMicros: number,
): number | null {
  let room: number | null = null;
  const periods: [number | null, PeriodSpend][] = [
    [budgets.dayMicros, spend.day],
    [budgets.monthMicros, spend.month],
    [budgets.creditMicros, spend.lifetime],
  ];
  for (const [limit, period] of periods) {
    if (limit === null) continue;
    const left = limit - period.settledMicros - period.reservedMicros;
    room = room === null ? left : Math.min(room, left);
  }
  return room === null ? null : reservationMicros + Math.max(0, room);
}

/**
 * The first budget that reserving `requestedMicros` more would overdraw, or null. A budget
 * holds settled costs plus open reservations; both together never exceed it.
 */
export function budgetRefusal(
  budgets: Budgets,
  spend: SpendState,
  requestedMicros: number,
  now: number,
): Omit<QuotaRefusal, "rateLimit"> | null {
  const periods: [BudgetName, number | null, PeriodSpend, number | null][] = [
    ["credit", budgets.creditMicros, spend.lifetime, null],
    ["month", budgets.monthMicros, spend.month, msToNextUtcMonth(now)],
    ["day", budgets.dayMicros, spend.day, msToNextUtcDay(now)],
  ];
  for (const [budget, limit, period, untilNextPeriod] of periods) {
    if (limit === null) continue;
    const committed = period.settledMicros + period.reservedMicros;
    if (committed + requestedMicros <= limit) continue;
    // Open reservations usually settle for less: then a retry soon may fit.
    const reservationsInTheWay = period.settledMicros + requestedMicros <= limit;
    return {
      ok: false,
      code: "insufficient_quota",
      budget,
      limitMicros: limit,
      spentMicros: period.settledMicros,
      reservedMicros: period.reservedMicros,
      requestedMicros,
      retryAfterMs: reservationsInTheWay ? CONCURRENCY_RETRY_MS : untilNextPeriod,
    };
  }
  return null;
}
