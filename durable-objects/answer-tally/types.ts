/**
 * What edge isolates and the `AnswerTally` objects agree on (docs/metrics.md, "Every
 * answer"): answers counted by route group, status class and error code, and the latest
 * error answers, pushed in bulk by each isolate and read back when `/metrics` is scraped.
 */

/** Tally objects an edge spreads its isolates over; a scrape reads them all. */
export const ANSWER_TALLY_SHARDS = 4;

/** Error answers each tally object keeps for the dashboard. */
export const TALLY_RECENT_ERRORS = 50;

/** One counted series: the answers of one route group, status class and code. */
export interface AnswerSeries {
  /** `v1` (the OpenAI API), `admin` (admin API, `/metrics`) or `other`. */
  route: string;
  /** `2xx`, `4xx`, `5xx`, … */
  statusClass: string;
  /** The error's `code` (the origin's own for an answer it gave), `none` without one. */
  code: string;
  count: number;
}

/** One error answer, as the dashboard lists it. */
export interface AnsweredError {
  requestId: string;
  at: number;
  status: number;
  code: string;
  method: string;
  path: string;
  /** The model asked for, when the body was read that far. */
  model: string | null;
  /** The key's id, when the credential was accepted. */
  keyId: string | null;
}

/** What an isolate pushes, and what a tally answers. */
export interface AnswerBatch {
  series: AnswerSeries[];
  errors: AnsweredError[];
}
