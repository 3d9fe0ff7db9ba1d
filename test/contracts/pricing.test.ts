import { describe, expect, it } from "vitest";
import {
  FREE,
  billedPicos,
  costPicos,
  formatUsd,
  microsToUsd,
  msToNextUtcDay,
  msToNextUtcMonth,
  picosToUsd,
  reservedPromptTokens,
  usdToMicros,
  utcDay,
  utcMonth,
  worstCasePicos,
  type ModelPrice,
} from "../../contracts/pricing.ts";

// $0.15 per 1M input tokens, $0.075 per 1M cached input tokens, $0.60 per 1M output tokens.
const price: ModelPrice = {
  inputMicrosPerMtok: 150_000,
  cachedInputMicrosPerMtok: 75_000,
  outputMicrosPerMtok: 600_000,
};

// Whole micro-dollars in pico-dollars.
const micros = (n: number) => BigInt(n) * 1_000_000n;

describe("costs", () => {
  it("prices uncached prompt, cached prompt and completion tokens at their own prices", () => {
    const usage = { promptTokens: 1_000_000, cachedTokens: 400_000, completionTokens: 1_000_000 };
    // 600k × $0.15 + 400k × $0.075 + 1M × $0.60 = $0.09 + $0.03 + $0.60
    expect(costPicos(usage, price)).toBe(micros(720_000));
  });

  it("never rounds: a request worth a fraction of a micro-dollar costs that fraction", () => {
    const embeddings = { ...FREE, inputMicrosPerMtok: 20_000 }; // $0.02 per 1M tokens
    const tenTokens = { promptTokens: 10, cachedTokens: 0, completionTokens: 0 };
    expect(costPicos(tenTokens, embeddings)).toBe(200_000n); // 0.2 µ$
    let total = 0n;
    for (let i = 0; i < 100; i++) total += costPicos(tenTokens, embeddings);
    expect(total).toBe(micros(20));
    expect(picosToUsd(total)).toBe(0.00002);
  });

  it("stays exact where binary floats would not", () => {
    // 10M tokens at $1000 per 1M: 1e22 pico-dollars, far past 2^53.
    const pricey = { ...FREE, outputMicrosPerMtok: 1_000_000_000 };
    const cost = costPicos(
      { promptTokens: 0, cachedTokens: 0, completionTokens: 10_000_001 },
      pricey,
    );
    expect(cost).toBe(micros(10_000_001_000));
    expect(formatUsd(cost + 1n)).toBe("10000.001000000001");
    expect(usdToMicros(0.1)! + usdToMicros(0.2)!).toBe(usdToMicros(0.3));
  });

  it("never counts more cached tokens than prompt tokens, nor negative counts", () => {
    expect(
      costPicos(
        { promptTokens: 10, cachedTokens: 50, completionTokens: -3 },
        { ...FREE, cachedInputMicrosPerMtok: 1_000_000 },
      ),
    ).toBe(micros(10));
  });

  it("reserves the worst case: the prompt with room for the chat template, uncached, and every max token", () => {
    expect(reservedPromptTokens(0)).toBe(32);
    expect(reservedPromptTokens(774)).toBe(1_000);
    expect(worstCasePicos(price, 774, 2_000)).toBe(micros(150 + 1_200));
  });

  it("bills the usage, at most a budget's cap, and nothing without usage", () => {
    const usage = { promptTokens: 1_000, cachedTokens: 1_000, completionTokens: 100 };
    expect(billedPicos(usage, price, null)).toBe(micros(75 + 60));
    expect(billedPicos(usage, price, micros(100))).toBe(micros(100));
    expect(billedPicos(usage, price, -5n)).toBe(0n);
    expect(billedPicos(null, price, null)).toBe(0n);
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

  it("writes pico-dollars as exact decimals of six to twelve places, and as JSON numbers", () => {
    expect(formatUsd(micros(123))).toBe("0.000123");
    expect(formatUsd(micros(1_500_000))).toBe("1.500000");
    expect(formatUsd(0n)).toBe("0.000000");
    expect(formatUsd(200_000n)).toBe("0.0000002");
    expect(formatUsd(1n)).toBe("0.000000000001");
    expect(JSON.stringify(picosToUsd(micros(123)))).toBe("0.000123");
    expect(JSON.stringify(picosToUsd(micros(720_000)))).toBe("0.72");
    expect(JSON.stringify(picosToUsd(200_000n))).toBe("2e-7");
    // Past 2^53 pico-dollars, the double nearest the exact decimal.
    expect(picosToUsd(10n ** 18n + 5n)).toBe(1_000_000);
    expect(JSON.stringify(microsToUsd(123))).toBe("0.000123");
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
