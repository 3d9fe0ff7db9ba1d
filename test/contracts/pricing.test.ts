import { describe, expect, it } from "vitest";
import {
  FREE,
  billedMicros,
  costMicros,
  costPicos,
  formatUsd,
  microsToUsd,
  msToNextUtcDay,
  msToNextUtcMonth,
  reservedPromptTokens,
  usdToMicros,
  utcDay,
  utcMonth,
  worstCaseMicros,
  type ModelPrice,
} from "../../contracts/pricing.ts";

// $0.15 per 1M input tokens, $0.075 per 1M cached input tokens, $0.60 per 1M output tokens.
const price: ModelPrice = {
  inputMicrosPerMtok: 150_000,
  cachedInputMicrosPerMtok: 75_000,
  outputMicrosPerMtok: 600_000,
};

const output = (completionTokens: number) => ({
  promptTokens: 0,
  cachedTokens: 0,
  completionTokens,
});

describe("costs", () => {
  it("prices uncached prompt, cached prompt and completion tokens at their own prices", () => {
    const usage = { promptTokens: 1_000_000, cachedTokens: 400_000, completionTokens: 1_000_000 };
    // 600k × $0.15 + 400k × $0.075 + 1M × $0.60 = $0.09 + $0.03 + $0.60
    expect(costMicros(usage, price)).toBe(720_000);
  });

  it("rounds once per request to whole micro-dollars, half up", () => {
    const perToken = { ...FREE, outputMicrosPerMtok: 150_000 }; // 0.15 µ$ a token
    expect(costMicros(output(3), perToken)).toBe(0); // 0.45
    expect(costMicros(output(4), perToken)).toBe(1); // 0.60
    expect(costMicros(output(10), perToken)).toBe(2); // 1.50 rounds up
    expect(costPicos(output(10), perToken)).toBe(1_500_000n);
  });

  it("stays exact where binary floats would not", () => {
    // 10M tokens at $1000 per 1M: 1e17 pico-dollars, past 2^53.
    const pricey = { ...FREE, outputMicrosPerMtok: 1_000_000_000 };
    expect(
      costMicros({ promptTokens: 0, cachedTokens: 0, completionTokens: 10_000_001 }, pricey),
    ).toBe(10_000_001_000);
    expect(usdToMicros(0.1)! + usdToMicros(0.2)!).toBe(usdToMicros(0.3));
    // A thousand requests of 7 output tokens at $0.15/1M: each 1.05 µ$ billed as 1 µ$.
    let total = 0;
    for (let i = 0; i < 1_000; i++) {
      total += costMicros(
        { promptTokens: 0, cachedTokens: 0, completionTokens: 7 },
        {
          ...FREE,
          outputMicrosPerMtok: 150_000,
        },
      );
    }
    expect(total).toBe(1_000);
  });

  it("never counts more cached tokens than prompt tokens, nor negative counts", () => {
    expect(
      costMicros(
        { promptTokens: 10, cachedTokens: 50, completionTokens: -3 },
        { ...FREE, cachedInputMicrosPerMtok: 1_000_000 },
      ),
    ).toBe(10);
  });

  it("reserves the worst case: the prompt with room for the chat template, uncached, and every max token", () => {
    expect(reservedPromptTokens(0)).toBe(32);
    expect(reservedPromptTokens(774)).toBe(1_000);
    expect(worstCaseMicros(price, 774, 2_000)).toBe(150 + 1_200);
  });

  it("bills the usage, at most a budget's cap, and nothing without usage", () => {
    const usage = { promptTokens: 1_000, cachedTokens: 1_000, completionTokens: 100 };
    expect(billedMicros(usage, price, null)).toBe(75 + 60);
    expect(billedMicros(usage, price, 100)).toBe(100);
    expect(billedMicros(usage, price, -5)).toBe(0);
    expect(billedMicros(null, price, null)).toBe(0);
  });
});

describe("dollars", () => {
  it("turns USD amounts with up to six decimals into micro-dollars, and refuses the rest", () => {
    expect(usdToMicros(0.15)).toBe(150_000);
    expect(usdToMicros(2.5)).toBe(2_500_000);
    expect(usdToMicros(0.000001)).toBe(1);
    expect(usdToMicros(0)).toBe(0);
    expect(usdToMicros(0.0000001)).toBeNull();
    expect(usdToMicros(-1)).toBeNull();
    expect(usdToMicros(Number.NaN)).toBeNull();
  });

  it("writes micro-dollars as six-place decimals and JSON numbers", () => {
    expect(formatUsd(123)).toBe("0.000123");
    expect(formatUsd(1_500_000)).toBe("1.500000");
    expect(formatUsd(0)).toBe("0.000000");
    expect(JSON.stringify(microsToUsd(123))).toBe("0.000123");
    expect(JSON.stringify(microsToUsd(720_000))).toBe("0.72");
  });
});

describe("periods", () => {
  it("names UTC days and months and the time to the next one", () => {
    const t = Date.UTC(2026, 11, 31, 22, 30);
    expect(utcDay(t)).toBe("2026-12-31");
    expect(utcMonth(t)).toBe("2026-12");
    expect(msToNextUtcDay(t)).toBe(90 * 60_000);
    expect(msToNextUtcMonth(t)).toBe(90 * 60_000);
  });

  it("names the day right at and around midnight, asked in any order", () => {
    const midnight = Date.UTC(2027, 0, 1);
    expect(utcDay(midnight - 1)).toBe("2026-12-31");
    expect(utcDay(midnight)).toBe("2027-01-01");
    expect(utcDay(midnight - 1)).toBe("2026-12-31");
    expect(utcDay(Date.UTC(1969, 11, 31, 23, 59))).toBe("1969-12-31");
    expect(utcDay(midnight + 86_399_999)).toBe("2027-01-01");
  });
});
