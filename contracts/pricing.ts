/**
 * Prices and costs as exact integers (docs/edge.md, "Pricing"): prices in micro-dollars per
 * million tokens, costs in micro-dollars, a request's cost computed exactly in pico-dollars
 * and rounded once, half up. The edge and the KeyAccount both use it, so the cost a
 * response header shows is the cost the ledger records.
 */
/** Micro-dollars in one US dollar. */
export const MICROS_PER_USD = 1_000_000;

/** Prices are per this many tokens. */
export const TOKENS_PER_PRICE_UNIT = 1_000_000;

// Largest micro-dollar amount accepted from configuration or the admin API ($1e9).
const MAX_MICROS = 1e15;

/** A model's prices in micro-dollars per million tokens (exact integers). */
export interface ModelPrice {
  inputMicrosPerMtok: number;
  /** Prompt tokens the origin's prefix cache served. */
  cachedInputMicrosPerMtok: number;
  outputMicrosPerMtok: number;
}

/** The price of a model that has none configured. */
export const FREE: ModelPrice = {
  inputMicrosPerMtok: 0,
  cachedInputMicrosPerMtok: 0,
  outputMicrosPerMtok: 0,
};

/** Token counts a cost is computed from, as the origin reported them. */
export interface TokenUsage {
  promptTokens: number;
  /** Of the prompt tokens, those the prefix cache served (billed at the cached price). */
  cachedTokens: number;
  completionTokens: number;
}

/** The exact cost of some usage in pico-dollars. */
export function costPicos(usage: TokenUsage, price: ModelPrice): bigint {
  const prompt = tokens(usage.promptTokens);
  const cached = Math.min(prompt, tokens(usage.cachedTokens));
  const completion = tokens(usage.completionTokens);
  return (
    BigInt(prompt - cached) * BigInt(price.inputMicrosPerMtok) +
    BigInt(cached) * BigInt(price.cachedInputMicrosPerMtok) +
    BigInt(completion) * BigInt(price.outputMicrosPerMtok)
  );
}

/** Pico-dollars rounded to whole micro-dollars, half up. */
export function picosToMicros(picos: bigint): number {
  const perMicro = BigInt(TOKENS_PER_PRICE_UNIT);
  return Number((picos + perMicro / 2n) / perMicro);
}

/** A request's cost in micro-dollars: the exact cost, rounded once, half up. */
export function costMicros(usage: TokenUsage, price: ModelPrice): number {
  return picosToMicros(costPicos(usage, price));
}

/**
 * Prompt tokens reserved for an estimated prompt: a quarter more plus 32, because the
 * engine's chat template adds tokens the edge cannot see (role markers, a default system
 * prompt such as Qwen's), so engines count more prompt tokens than the estimate.
 */
export function reservedPromptTokens(estimate: number): number {
  return Math.ceil((Math.max(0, estimate) * 5) / 4) + 32;
}

/**
 * The most a request can cost: its prompt ({@link reservedPromptTokens} of the estimate)
 * uncached at the input price plus all of `maxTokens` at the output price. Admission
 * reserves this against the key's budgets.
 */
export function worstCaseMicros(
  price: ModelPrice,
  promptTokens: number,
  maxTokens: number,
): number {
  return costMicros(
    {
      promptTokens: reservedPromptTokens(promptTokens),
      cachedTokens: 0,
      completionTokens: maxTokens,
    },
    price,
  );
}

/**
 * What a finished request is billed: the cost of the origin's usage, at most `capMicros`
 * when a budget limits it (null: no cap), and nothing when no usage was reported (no engine
 * ran it, or the connection broke before the origin could say).
 */
export function billedMicros(
  usage: TokenUsage | null,
  price: ModelPrice,
  capMicros: number | null,
): number {
  if (usage === null) return 0;
  const cost = costMicros(usage, price);
  return capMicros === null ? cost : Math.min(cost, Math.max(0, capMicros));
}

/**
 * A USD amount as integer micro-dollars; null when it is negative, too large, or has more
 * than six decimal places (it would not be exact).
 */
export function usdToMicros(usd: number): number | null {
  if (!Number.isFinite(usd) || usd < 0) return null;
  const micros = Math.round(usd * MICROS_PER_USD);
  // Binary floats cannot hold most decimals exactly; within a thousandth of a micro-dollar
  // the decimal had at most six places.
  if (Math.abs(usd * MICROS_PER_USD - micros) > 1e-3 || micros > MAX_MICROS) return null;
  return micros;
}

/** Micro-dollars as a USD number for JSON (prints exactly, e.g. 0.000123). */
export function microsToUsd(micros: number): number {
  return micros / MICROS_PER_USD;
}

/** Micro-dollars as a USD decimal string with six places, e.g. `0.000123`. */
export function formatUsd(micros: number): string {
  const sign = micros < 0 ? "-" : "";
  const abs = Math.abs(Math.trunc(micros));
  const whole = Math.floor(abs / MICROS_PER_USD);
  const fraction = String(abs % MICROS_PER_USD).padStart(6, "0");
  return `${sign}${whole}.${fraction}`;
}

// The last day `utcDay` named: every admission and settlement asks, nearly always for the
// same day, and formatting a date costs more than the rest of the lookup.
let lastDay = { number: Number.NaN, text: "" };

/** The UTC calendar day of a time, `YYYY-MM-DD`. */
export function utcDay(now: number): string {
  const number = Math.floor(now / 86_400_000);
  if (number !== lastDay.number) {
    lastDay = { number, text: new Date(now).toISOString().slice(0, 10) };
  }
  return lastDay.text;
}

/** The UTC calendar month of a time, `YYYY-MM`. */
export function utcMonth(now: number): string {
  return new Date(now).toISOString().slice(0, 7);
}

/** Milliseconds from `now` to the next UTC midnight. */
export function msToNextUtcDay(now: number): number {
  const date = new Date(now);
  return Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), date.getUTCDate() + 1) - now;
}

/** Milliseconds from `now` to the first instant of the next UTC month. */
export function msToNextUtcMonth(now: number): number {
  const date = new Date(now);
  return Date.UTC(date.getUTCFullYear(), date.getUTCMonth() + 1, 1) - now;
}

function tokens(n: number): number {
  return Number.isFinite(n) ? Math.max(0, Math.floor(n)) : 0;
}
