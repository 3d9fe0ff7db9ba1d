/**
 * The limits of a benchmark's key (docs/benchmarks.md): every one enforced on every
 * request, none reached, so a run measures what checking them costs.
 */
export const BENCH_KEY_LIMITS = {
  rpm: 100_000_000,
  tpm: 1_000_000_000_000,
  concurrency: 1_024,
  credit_usd: 100_000_000,
};

/** The budgets of a benchmark's key: a day and a month, checked on every request, never reached. */
export const BENCH_KEY_BUDGETS = [
  { period: "1d", max_usd: 1_000_000 },
  { period: "month", max_usd: 10_000_000 },
];
