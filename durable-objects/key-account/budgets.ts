/**
 * Budgets as pure functions over a budget list and the spend of each budget's window: the
 * windows of a period (fixed, aligned to the UTC epoch, or the calendar month), the first
 * budget a reservation would overdraw, the most a settling request may be billed, the room
 * left and the soft limits crossed (docs/key-account.md, "Budgets"). Reused for any owner of
 * budgets: it knows nothing of keys.
 */
import { type BudgetWindow, HOUR_MS, periodWindow } from "../../contracts/budget-periods.ts";
import { maxPicos, microsToPicos } from "../../contracts/pricing.ts";
import type { AdmissionRefusal } from "./types.ts";
import type { BudgetName, BudgetStatus, Budgets } from "./budget-types.ts";

/** Spend in one period, in pico-dollars: costs of settled requests and reservations of open ones. */
export interface PeriodSpend {
  settledPicos: bigint;
  reservedPicos: bigint;
}

/** One budget in force at an instant: its window, limits and the window's spend. */
export interface BudgetLine {
  /** The period (`1h`, `7d`, `month`…), or `credit` for the lifetime credit. */
  name: BudgetName;
  limitPicos: bigint;
  softPicos: bigint | null;
  /** Null for the credit, which never resets. */
  window: BudgetWindow | null;
  spend: PeriodSpend;
}

/** Milliseconds suggested before retrying a request refused for concurrency. */
export const CONCURRENCY_RETRY_MS = 1_000;

/** When a line's window ends (epoch ms), or null for the credit. */
export function resetsAt(line: Pick<BudgetLine, "window">): number | null {
  return line.window === null ? null : line.window.endHour * HOUR_MS;
}

/**
 * The budgets in force at `at`, each with the spend of its window (`spendIn`) or of the
 * lifetime: what every other function here reads.
 */
export function budgetLines(
  budgets: Budgets,
  at: number,
  spendIn: (window: BudgetWindow) => PeriodSpend,
  lifetime: () => PeriodSpend,
): BudgetLine[] {
  const lines: BudgetLine[] = budgets.periods.map((budget) => {
    const window = periodWindow(budget.period, at);
    return {
      name: budget.period,
      limitPicos: microsToPicos(budget.limitMicros),
      softPicos: budget.softMicros === null ? null : microsToPicos(budget.softMicros),
      window,
      spend: spendIn(window),
    };
  });
  if (budgets.creditMicros !== null) {
    lines.push({
      name: "credit",
      limitPicos: microsToPicos(budgets.creditMicros),
      softPicos: null,
      window: null,
      spend: lifetime(),
    });
  }
  return lines;
}

/** The lines as they stand: each window's spend, when it started and when it resets. */
export function budgetStatuses(lines: readonly BudgetLine[]): BudgetStatus[] {
  return lines.map((line) => ({
    budget: line.name,
    limitPicos: line.limitPicos,
    softPicos: line.softPicos,
    spentPicos: line.spend.settledPicos,
    reservedPicos: line.spend.reservedPicos,
    startsAt: line.window === null ? null : line.window.startHour * HOUR_MS,
    resetsAt: resetsAt(line),
  }));
}

/** Whether there is any budget. */
export function hasBudgets(budgets: Budgets): boolean {
  return budgets.periods.length > 0 || budgets.creditMicros !== null;
}

/** Room left in the tightest budget (pico-dollars, may be negative), or null without any. */
export function budgetRoom(lines: readonly BudgetLine[]): bigint | null {
  let room: bigint | null = null;
  for (const line of lines) {
    const left = line.limitPicos - line.spend.settledPicos - line.spend.reservedPicos;
    room = room === null || left < room ? left : room;
  }
  return room;
}

/**
 * The most a settling request may be billed without taking any budget past its limit: its
 * own reservation (agreed at admission) plus whatever room the budgets have left; null
 * without budgets. The lines' spend includes the request's reservation while it is open.
 */
export function billingCap(lines: readonly BudgetLine[], reservationPicos: bigint): bigint | null {
  const room = budgetRoom(lines);
  return room === null ? null : reservationPicos + maxPicos(0n, room);
}

/** Why a budget refuses a reservation. */
export type BudgetRefusal = Omit<
  Extract<AdmissionRefusal, { code: "insufficient_quota" }>,
  "rateLimit" | "scope"
>;

/**
 * The budget that reserving `requestedPicos` more would overdraw (the one that stays in the
 * way longest), or null. A budget holds settled costs plus open reservations; both together
 * never exceed it.
 */
export function budgetRefusal(
  lines: readonly BudgetLine[],
  requestedPicos: bigint,
  now: number,
): BudgetRefusal | null {
  let worst: BudgetRefusal | null = null;
  for (const line of lines) {
    const { settledPicos, reservedPicos } = line.spend;
    if (settledPicos + reservedPicos + requestedPicos <= line.limitPicos) continue;
    const ends = resetsAt(line);
    // Open reservations usually settle for less: then a retry soon may fit. A request
    // whose worst case is more than the whole budget never fits: no retry helps.
    const reservationsInTheWay = settledPicos + requestedPicos <= line.limitPicos;
    const neverFits = requestedPicos > line.limitPicos;
    const refusal: BudgetRefusal = {
      ok: false,
      code: "insufficient_quota",
      budget: line.name,
      limitPicos: line.limitPicos,
      spentPicos: settledPicos,
      reservedPicos,
      requestedPicos,
      retryAfterMs: reservationsInTheWay
        ? CONCURRENCY_RETRY_MS
        : ends === null || neverFits
          ? null
          : Math.max(0, ends - now),
      resetsAt: ends,
    };
    if (worst === null || waitOf(refusal) > waitOf(worst)) worst = refusal;
  }
  return worst;
}

function waitOf(refusal: BudgetRefusal): number {
  return refusal.retryAfterMs ?? Number.POSITIVE_INFINITY;
}

/** A soft limit whose window's settled spend has reached it. */
export interface SoftCrossing {
  period: BudgetName;
  window: BudgetWindow;
  softPicos: bigint;
  limitPicos: bigint;
  spentPicos: bigint;
}

/** The soft limits that the settled spend of their window has reached. */
export function softCrossings(lines: readonly BudgetLine[]): SoftCrossing[] {
  const crossed: SoftCrossing[] = [];
  for (const line of lines) {
    if (line.softPicos === null || line.window === null) continue;
    if (line.spend.settledPicos < line.softPicos) continue;
    crossed.push({
      period: line.name,
      window: line.window,
      softPicos: line.softPicos,
      limitPicos: line.limitPicos,
      spentPicos: line.spend.settledPicos,
    });
  }
  return crossed;
}
