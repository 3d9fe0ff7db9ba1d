/**
 * What a key's requests looked like, for the edge's `/metrics` and dashboard
 * (docs/metrics.md): counters and histograms per model, region and status class, updated
 * when a request settles or its admission is refused, and the latest errors. Pure: the
 * store keeps them in the `metrics` table (store/metrics.ts).
 */
import { type HistogramData, emptyHistogram, observe } from "../../contracts/prometheus.ts";
import { DURATION_BOUNDS_S, type SettleInput, type SettleOutcome, TTFT_BOUNDS_S } from "./types.ts";

/** Errors a key keeps for the dashboard. */
export const RECENT_ERRORS = 20;

/** One model, region and status class of a key's requests. */
export interface RequestSeries {
  model: string;
  /** The serving region, or `none` when no region served it (refused, failed). */
  region: string;
  /** `2xx`, `4xx`, `5xx`. */
  statusClass: string;
  requests: number;
  /** Origins tried, all requests together (one per request served at once). */
  attempts: number;
  /** Origins tried after a request's first failed before its first byte. */
  retries: number;
  /** Pico-dollars billed: a float counter like every metric, exact below 2^53 ($9,007). */
  spendPicos: number;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  durationS: HistogramData;
  ttftS: HistogramData;
  /** The response cache's part in them (absent until it served one, as in older series). */
  cache?: CacheCounts;
}

/** What the response cache did for a series' requests (docs/cache.md). */
export interface CacheCounts {
  hits: number;
  misses: number;
  /** Bytes served from the cache. */
  bytesSaved: number;
  /** Prompt and completion tokens the hits' answers took to generate, not generated again. */
  tokensSaved: number;
}

/** A request that ended in an error, for the dashboard. */
export interface RecentError {
  requestId: string;
  at: number;
  model: string;
  region: string;
  status: number;
  outcome: SettleOutcome | "refused";
  code: string | null;
}

/** What `KeyAccount.metrics()` answers. */
export interface KeyMetrics {
  keyId: string;
  name: string;
  tier: string;
  series: RequestSeries[];
  recentErrors: RecentError[];
  /** Soft-budget alert events per period and outcome (counters). */
  budgetAlerts: { period: string; outcome: AlertOutcome; count: number }[];
}

/** What the metrics of one request are made of. */
export interface RequestSample {
  requestId: string;
  model: string;
  region: string;
  status: number;
  outcome: SettleOutcome | "refused";
  code?: string | null;
  durationMs: number | null;
  ttftMs: number | null;
  attempts: number;
  costPicos: bigint;
  tokens: { prompt: number; cached: number; completion: number } | null;
  /** How the response cache served it, when it was used. */
  cache?: { result: "hit" | "miss"; bytes: number; tokensSaved: number };
  at: number;
}

/** A key's metrics as the account holds them. */
export interface MetricsState {
  series: Map<string, RequestSeries>;
  errors: RecentError[];
  /** Soft-budget alert events by `<period>\n<outcome>`. */
  alerts: Record<string, number>;
}

/**
 * What happened to a soft-budget alert: `raised` (a window's soft limit crossed, once per
 * window), `retried` (an attempt failed, another is due), `delivered` (a 2xx), `dropped`
 * (no attempt left, or no signing secret).
 */
export type AlertOutcome = "raised" | "retried" | "delivered" | "dropped";

/** The status class of an HTTP status. */
export function statusClass(status: number): string {
  return `${Math.min(5, Math.max(1, Math.floor(status / 100)))}xx`;
}

/** Adds one request to the series it belongs to; an error also to the recent ones. */
export function addSample(
  state: MetricsState,
  sample: RequestSample,
): { key: string; isError: boolean } {
  const cls = statusClass(sample.status);
  const key = `${sample.model}\u0000${sample.region}\u0000${cls}`;
  let series = state.series.get(key);
  if (series === undefined) {
    series = {
      model: sample.model,
      region: sample.region,
      statusClass: cls,
      requests: 0,
      attempts: 0,
      retries: 0,
      spendPicos: 0,
      promptTokens: 0,
      cachedTokens: 0,
      completionTokens: 0,
      durationS: emptyHistogram(DURATION_BOUNDS_S),
      ttftS: emptyHistogram(TTFT_BOUNDS_S),
    };
    state.series.set(key, series);
  }
  series.requests += 1;
  series.attempts += sample.attempts;
  series.retries += Math.max(0, sample.attempts - 1);
  series.spendPicos += Number(sample.costPicos);
  if (sample.tokens !== null) {
    series.promptTokens += sample.tokens.prompt;
    series.cachedTokens += Math.min(sample.tokens.cached, sample.tokens.prompt);
    series.completionTokens += sample.tokens.completion;
  }
  if (sample.cache !== undefined) {
    const counts = (series.cache ??= { hits: 0, misses: 0, bytesSaved: 0, tokensSaved: 0 });
    if (sample.cache.result === "hit") {
      counts.hits += 1;
      counts.bytesSaved += sample.cache.bytes;
      counts.tokensSaved += sample.cache.tokensSaved;
    } else {
      counts.misses += 1;
    }
  }
  if (sample.durationMs !== null)
    observe(series.durationS, DURATION_BOUNDS_S, sample.durationMs / 1000);
  if (sample.ttftMs !== null) observe(series.ttftS, TTFT_BOUNDS_S, sample.ttftMs / 1000);
  const isError =
    sample.status >= 400 || (sample.outcome !== "ok" && sample.outcome !== "cancelled");
  if (isError) {
    state.errors.push({
      requestId: sample.requestId,
      at: sample.at,
      model: sample.model,
      region: sample.region,
      status: sample.status,
      outcome: sample.outcome,
      code: sample.code ?? null,
    });
    if (state.errors.length > RECENT_ERRORS)
      state.errors.splice(0, state.errors.length - RECENT_ERRORS);
  }
  return { key, isError };
}

const REFUSAL_STATUS: Record<string, number> = {
  invalid_api_key: 401,
  origin_not_allowed: 403,
  key_blocked: 403,
  model_not_allowed: 403,
  rate_limit_exceeded: 429,
  insufficient_quota: 429,
};

/** The sample of an admission the account refused (it never reached an origin). */
export function refusedSample(
  requestId: string,
  model: string,
  code: string,
  now: number,
): RequestSample {
  return {
    requestId,
    model,
    region: "none",
    status: REFUSAL_STATUS[code] ?? 400,
    outcome: "refused",
    code,
    durationMs: null,
    ttftMs: null,
    attempts: 0,
    costPicos: 0n,
    tokens: null,
    at: now,
  };
}

/** The status a settlement without the edge's metrics stands for (a late one). */
function statusOf(outcome: SettleOutcome): number {
  return outcome === "ok" ? 200 : outcome === "cancelled" ? 499 : outcome === "timeout" ? 504 : 502;
}

/** The sample of a settled request. */
export function settledSample(
  input: SettleInput,
  model: string,
  costPicos: bigint,
  now: number,
): RequestSample {
  const m = input.metrics;
  const usage = input.usage ?? null;
  const { cache } = input;
  const hit = cache?.result === "hit";
  return {
    requestId: input.requestId,
    model: input.model ?? model,
    // Served by the edge itself, from the colo's response cache.
    region: hit ? "cache" : (m?.region ?? "none"),
    status: m?.status ?? statusOf(input.outcome),
    outcome: input.outcome,
    durationMs: m?.durationMs ?? null,
    ttftMs: m?.ttftMs ?? null,
    attempts: input.attempts?.filter((a) => a.origin !== null).length ?? 0,
    costPicos,
    ...(cache !== undefined && {
      cache: {
        result: cache.result,
        bytes: cache.bytes,
        tokensSaved: hit && usage !== null ? usage.prompt_tokens + usage.completion_tokens : 0,
      },
    }),
    // A hit's tokens were saved, not billed.
    tokens:
      usage === null || hit
        ? null
        : {
            prompt: usage.prompt_tokens,
            cached: usage.cached_tokens ?? 0,
            completion: usage.completion_tokens,
          },
    at: now,
  };
}
