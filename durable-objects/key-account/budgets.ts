/**
 * Budgets as pure functions: whether a key has any, the first one a reservation would
 * overdraw, and the most a settling request may be billed (docs/key-account.md).
 */
import {
  maxPicos,
  microsToPicos,
  msToNextUtcDay,
  msToNextUtcMonth,
} from "../../contracts/pricing.ts";
import type { AdmissionRefusal, BudgetName, Budgets } from "./types.ts";

/** Spend in one period, in pico-dollars: costs of settled requests and reservations of open ones. */
export interface PeriodSpend {
  settledPicos: bigint;
  reservedPicos: bigint;
}

/** A key's spend in the periods its budgets cover, as of the admission's day. */
export interface SpendState {
  day: PeriodSpend;
  month: PeriodSpend;
  lifetime: PeriodSpend;
}

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
  reservationPicos: bigint,
): bigint | null {
  let room: bigint | null = null;
  const periods: [number | null, PeriodSpend][] = [
    [budgets.dayMicros, spend.day],
    [budgets.monthMicros, spend.month],
    [budgets.creditMicros, spend.lifetime],
  ];
  for (const [limit, period] of periods) {
    if (limit === null) continue;
    const left = microsToPicos(limit) - period.settledPicos - period.reservedPicos;
    room = room === null || left < room ? left : room;
  }
  return room === null ? null : reservationPicos + maxPicos(0n, room);
}

/**
 * The first budget that reserving `requestedPicos` more would overdraw, or null. A budget
 * holds settled costs plus open reservations; both together never exceed it.
 */
export function budgetRefusal(
  budgets: Budgets,
  spend: SpendState,
  requestedPicos: bigint,
  now: number,
): Omit<QuotaRefusal, "rateLimit"> | null {
  const periods: [BudgetName, number | null, PeriodSpend, number | null][] = [
    ["credit", budgets.creditMicros, spend.lifetime, null],
    ["month", budgets.monthMicros, spend.month, msToNextUtcMonth(now)],
    ["day", budgets.dayMicros, spend.day, msToNextUtcDay(now)],
  ];
  for (const [budget, limitMicros, period, untilNextPeriod] of periods) {
    if (limitMicros === null) continue;
    const limit = microsToPicos(limitMicros);
    const committed = period.settledPicos + period.reservedPicos;
    if (committed + requestedPicos <= limit) continue;
    // Open reservations usually settle for less: then a retry soon may fit.
    const reservationsInTheWay = period.settledPicos + requestedPicos <= limit;
    return {
      ok: false,
      code: "insufficient_quota",
      budget,
      limitPicos: limit,
      spentPicos: period.settledPicos,
      reservedPicos: period.reservedPicos,
      requestedPicos,
      retryAfterMs: reservationsInTheWay ? CONCURRENCY_RETRY_MS : untilNextPeriod,
    };
  }
  return null;
}
