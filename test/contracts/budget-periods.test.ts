import { describe, expect, it } from "vitest";
import { HOUR_MS, isBudgetPeriod, periodWindow } from "../../contracts/budget-periods.ts";

const hours = (at: number) => at / HOUR_MS;

describe("budget periods", () => {
  it("knows hours up to 744, days up to 31 and the calendar month", () => {
    for (const period of ["1h", "24h", "744h", "1d", "7d", "30d", "31d", "month"]) {
      expect(isBudgetPeriod(period)).toBe(true);
    }
    for (const period of ["0h", "745h", "32d", "1w", "1.5d", "d", "01d", "Month", ""]) {
      expect(isBudgetPeriod(period)).toBe(false);
    }
  });

  it("aligns fixed windows to the epoch: 1d is the UTC day, 7d runs Thursday to Thursday", () => {
    const at = Date.UTC(2026, 10, 3, 23, 20);
    expect(periodWindow("1h", at)).toEqual({
      startHour: hours(Date.UTC(2026, 10, 3, 23)),
      endHour: hours(Date.UTC(2026, 10, 4)),
    });
    expect(periodWindow("1d", at)).toEqual({
      startHour: hours(Date.UTC(2026, 10, 3)),
      endHour: hours(Date.UTC(2026, 10, 4)),
    });
    const week = periodWindow("7d", at);
    expect(new Date(week.startHour * HOUR_MS).getUTCDay()).toBe(4);
    expect(week).toEqual({
      startHour: hours(Date.UTC(2026, 9, 29)),
      endHour: hours(Date.UTC(2026, 10, 5)),
    });
    const month = periodWindow("30d", at);
    expect(month.endHour - month.startHour).toBe(720);
    expect(month.startHour % 720).toBe(0);
  });

  it("takes the calendar month, however long it is", () => {
    expect(periodWindow("month", Date.UTC(2028, 1, 29, 12))).toEqual({
      startHour: hours(Date.UTC(2028, 1, 1)),
      endHour: hours(Date.UTC(2028, 2, 1)),
    });
    // The last instant of a window is in it; the next one starts the next window.
    expect(periodWindow("month", Date.UTC(2026, 11, 1) - 1).endHour).toBe(
      hours(Date.UTC(2026, 11, 1)),
    );
    expect(periodWindow("month", Date.UTC(2026, 11, 1)).startHour).toBe(
      hours(Date.UTC(2026, 11, 1)),
    );
  });
});
