/**
 * Budget periods (docs/key-account.md, "Budgets"): what a period may be and the window of
 * it that holds an instant. Windows are fixed, aligned to the UTC epoch and made of whole
 * UTC hours (`1d` is the UTC day, `7d` runs Thursday to Thursday), or the calendar month,
 * so spend kept per UTC hour sums exactly to any of them.
 */

/** Milliseconds in an hour: spend is kept per UTC hour. */
export const HOUR_MS = 3_600_000;

/** The longest period a budget may have, in hours (31 days): how far back spend must be kept. */
export const LONGEST_PERIOD_HOURS = 744;

/** A window of time in whole UTC hours since the epoch: [startHour, endHour). */
export interface BudgetWindow {
  startHour: number;
  endHour: number;
}

const PERIOD = /^([1-9]\d{0,2})([hd])$/;

/** `<n>h` (1–744), `<n>d` (1–31) or `month` (the UTC calendar month). */
export function isBudgetPeriod(period: string): boolean {
  return period === "month" || periodHours(period) !== null;
}

/** The UTC hour (since the epoch) an instant falls in. */
export function hourOf(at: number): number {
  return Math.floor(at / HOUR_MS);
}

/** The window of `period` that holds the instant `at`. */
export function periodWindow(period: string, at: number): BudgetWindow {
  const hour = hourOf(at);
  if (period === "month") {
    const date = new Date(hour * HOUR_MS);
    const y = date.getUTCFullYear();
    const m = date.getUTCMonth();
    return { startHour: Date.UTC(y, m, 1) / HOUR_MS, endHour: Date.UTC(y, m + 1, 1) / HOUR_MS };
  }
  const length = periodHours(period);
  if (length === null) throw new Error(`not a budget period: ${period}`);
  const startHour = Math.floor(hour / length) * length;
  return { startHour, endHour: startHour + length };
}

// The length of an `<n>h` or `<n>d` period in hours; null for anything else.
function periodHours(period: string): number | null {
  const match = PERIOD.exec(period);
  if (match === null) return null;
  const hours = Number(match[1]) * (match[2] === "d" ? 24 : 1);
  return hours <= LONGEST_PERIOD_HOURS ? hours : null;
}
