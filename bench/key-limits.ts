/**
 * The limits of a benchmark's key (docs/benchmarks.md): every one enforced on every
 * request, none reached, so a run measures what checking them costs.
 */
export const BENCH_KEY_LIMITS = {
  rpm: 100_000_000,
  tpm: 1_000_000_000_000,
  concurrency: 1_024,
  budget_usd_day: 1_000_000,
  budget_usd_month: 10_000_000,
  credit_usd: 100_000_000,
};
