import { describe, expect, it } from "vitest";
import { RetryBudget } from "../../../functions/delivery/retry-budget.ts";

const SETTINGS = { ratio: 0.1, floor: 2, windowMs: 10_000 };

describe("the retry budget", () => {
  it("allows the floor however few requests there were", () => {
    const budget = new RetryBudget();
    budget.request(0);
    expect([
      budget.retry(0, SETTINGS),
      budget.retry(0, SETTINGS),
      budget.retry(0, SETTINGS),
    ]).toEqual([true, true, false]);
  });

  it("grows with requests: a tenth of them on top of the floor", () => {
    const budget = new RetryBudget();
    for (let i = 0; i < 100; i++) budget.request(i);
    let allowed = 0;
    while (budget.retry(100, SETTINGS)) allowed++;
    expect(allowed).toBe(12);
  });

  it("forgets what left the window", () => {
    const budget = new RetryBudget();
    budget.request(0);
    budget.retry(0, SETTINGS);
    budget.retry(0, SETTINGS);
    expect(budget.retry(5_000, SETTINGS)).toBe(false);
    expect(budget.retry(10_001, SETTINGS)).toBe(true);
  });
});
