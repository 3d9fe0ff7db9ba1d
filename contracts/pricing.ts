/**
 * Prices and costs as exact integers (docs/edge.md, "Pricing"): prices in micro-dollars per
 * million tokens, so a token costs a whole number of pico-dollars, and costs, reservations
 * and spend in pico-dollars (bigint), never rounded. The edge and the KeyAccount both use
 * it, so the cost a response header shows is the cost the ledger records.
 */
/** Micro-dollars in one US dollar. */
export const MICROS_PER_USD = 1_000_000;

/** Pico-dollars in one micro-dollar: a price per million tokens is the pico-dollars a token costs. */
export const PICOS_PER_MICRO = 1_000_000n;

// Pico-dollars in one US dollar, and the most of them a double holds exactly (2^53).
const PICOS_PER_USD = 1e12;
const MAX_EXACT_PICOS = 2n ** 53n;

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

/** Whole micro-dollars (a budget) in pico-dollars. */
export function microsToPicos(micros: number): bigint {
  return BigInt(micros) * PICOS_PER_MICRO;
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
 * The most a request can cost, in pico-dollars: its prompt ({@link reservedPromptTokens} of
 * the estimate) uncached at the input price plus all of `maxTokens` at the output price.
 * Admission reserves this against the key's budgets.
 */
export function worstCasePicos(price: ModelPrice, promptTokens: number, maxTokens: number): bigint {
  return costPicos(
    {
      promptTokens: reservedPromptTokens(promptTokens),
      cachedTokens: 0,
      completionTokens: maxTokens,
    },
    price,
  );
}

/**
 * What a finished request is billed, in pico-dollars: the cost of the origin's usage, at
 * most `capPicos` when a budget limits it (null: no cap), and nothing when no usage was
 * reported (no engine ran it, or the connection broke before the origin could say).
 */
export function billedPicos(
  usage: TokenUsage | null,
  price: ModelPrice,
  capPicos: bigint | null,
): bigint {
  if (usage === null) return 0n;
  const cost = costPicos(usage, price);
  if (capPicos === null) return cost;
  const cap = capPicos > 0n ? capPicos : 0n;
  return cost < cap ? cost : cap;
}

/** The larger of two amounts. */
export function maxPicos(a: bigint, b: bigint): bigint {
  return a > b ? a : b;
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

/** Micro-dollars (a price or a budget) as a USD number for JSON (prints exactly, e.g. 0.000123). */
export function microsToUsd(micros: number): number {
  return micros / MICROS_PER_USD;
}

/**
 * Pico-dollars as a USD number for JSON: the double nearest the exact amount, which prints
 * as its decimal (2e-7 for 200000). A float count (a metric) is divided as it is.
 */
export function picosToUsd(picos: bigint | number): number {
  if (typeof picos === "number") return picos / PICOS_PER_USD;
  // One correctly rounded division when the count is exact in a double, else the decimal.
  const abs = picos < 0n ? -picos : picos;
  return abs <= MAX_EXACT_PICOS ? Number(picos) / PICOS_PER_USD : Number(formatUsd(picos));
}

/**
 * Pico-dollars as an exact USD decimal string: six places, more only as far as the amount
 * needs (at most twelve), e.g. `0.000123`, `0.0000002`.
 */
export function formatUsd(picos: bigint): string {
  const sign = picos < 0n ? "-" : "";
  const abs = picos < 0n ? -picos : picos;
  const perUsd = BigInt(PICOS_PER_USD);
  const digits = String(abs % perUsd).padStart(12, "0");
  // At most six trailing zeros go: six to twelve places.
  let end = 12;
  while (end > 6 && digits.charCodeAt(end - 1) === 48) end--;
  return `${sign}${abs / perUsd}.${digits.slice(0, end)}`;
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
