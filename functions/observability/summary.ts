/**
 * The dashboard's view of a collection (docs/metrics.md, "Dashboard"): regions and their
 * origins with breaker state, load, KV usage and prefix-hit rate; latency and
 * time-to-first-token histograms (the page turns their differences between two polls
 * into percentiles over time); batch sizes; the response cache; the keys with most
 * requests; recent errors.
 * Requests and errors are every answer of the OpenAI API, refusals before any key's
 * account included; errors carry their code (the origin's own where it gave one).
 */
import { picosToUsd } from "../../contracts/pricing.ts";
import { type HistogramData, emptyHistogram } from "../../contracts/prometheus.ts";
import type { RecentError } from "../../durable-objects/key-account/metrics.ts";
import { DURATION_BOUNDS_S, TTFT_BOUNDS_S } from "../../durable-objects/key-account/types.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import { BATCH_SIZE_BOUNDS, type FleetStats, batchSizeCounts, originShares } from "./collect.ts";

/** Keys and errors the dashboard lists. */
const TOP_KEYS = 10;
const ERRORS = 25;

function merged(bounds: readonly number[]): HistogramData & { bounds: readonly number[] } {
  return { bounds, ...emptyHistogram(bounds) };
}

function addInto(into: HistogramData, from: HistogramData): void {
  from.counts.forEach((n, i) => {
    into.counts[i] = (into.counts[i] ?? 0) + n;
  });
  into.sum += from.sum;
  into.count += from.count;
}

/** What `GET /admin/stats` answers. */
export function summarize(stats: FleetStats, config: ResolvedConfig) {
  const latency = merged(DURATION_BOUNDS_S);
  const ttft = merged(TTFT_BOUNDS_S);
  let spendPicos = 0;
  const cache = { hits: 0, misses: 0, bytes_saved: 0, tokens_saved: 0 };
  const keys = stats.keys.map((key) => {
    let n = 0;
    let picos = 0;
    let hits = 0;
    let tokensSaved = 0;
    for (const s of key.series) {
      addInto(latency, s.durationS);
      addInto(ttft, s.ttftS);
      n += s.requests;
      picos += s.spendPicos;
      if (s.cache === undefined) continue;
      hits += s.cache.hits;
      tokensSaved += s.cache.tokensSaved;
      cache.misses += s.cache.misses;
      cache.bytes_saved += s.cache.bytesSaved;
    }
    spendPicos += picos;
    cache.hits += hits;
    cache.tokens_saved += tokensSaved;
    return {
      id: key.keyId,
      name: key.name,
      tier: key.tier,
      requests: n,
      spend_usd: picosToUsd(picos),
      cache_hits: hits,
      cache_tokens_saved: tokensSaved,
    };
  });
  const api = stats.answers.series.filter((s) => s.route === "v1");
  const requests = api.reduce((sum, s) => sum + s.count, 0);
  const errors = api
    .filter((s) => s.statusClass === "4xx" || s.statusClass === "5xx")
    .reduce((sum, s) => sum + s.count, 0);

  const batchSizes = merged(BATCH_SIZE_BOUNDS);
  const load = new Map<
    string,
    {
      running: number;
      waiting: number;
      kv_usage: number;
      prefix_hit: number | null;
      age_ms: number;
    }
  >();
  for (const b of stats.batchers) {
    const sizes = batchSizeCounts(b.snapshot.counters.batchSizes);
    addInto(batchSizes, {
      counts: sizes.counts,
      sum: b.snapshot.counters.batchItems,
      count: sizes.calls,
    });
    for (const [origin, report] of Object.entries(b.snapshot.origins)) {
      const seen = load.get(origin);
      if (report === null || (seen !== undefined && seen.age_ms <= report.ageMs)) continue;
      const shares = originShares(report, b.reportTtlMs);
      load.set(origin, {
        running: shares.running,
        waiting: shares.waiting,
        kv_usage: shares.kvUsage,
        prefix_hit: shares.prefixHit,
        age_ms: report.ageMs,
      });
    }
  }
  const breakers = new Map(stats.breakers.map((view) => [view.origin, view]));
  const routing = stats.batchers
    .filter((b) => b.snapshot.routing !== null)
    .map((b) => ({
      region: b.region,
      model: b.model,
      shard: b.shard,
      predicted: b.snapshot.routing?.hit_rate.predicted ?? null,
      reported: b.snapshot.routing?.hit_rate.reported ?? null,
    }));
  return {
    at: stats.at,
    totals: { requests, errors, spend_usd: picosToUsd(spendPicos), keys: stats.keys.length },
    /** The response cache: hits and misses, bytes and tokens saved (docs/cache.md). */
    cache,
    regions: config.regions.map((region) => ({
      id: region.id,
      origins: region.origins.map((origin) => ({
        id: origin.id,
        breaker: breakers.get(origin.id)?.state ?? "closed",
        ...(load.get(origin.id) ?? {
          running: null,
          waiting: null,
          kv_usage: null,
          prefix_hit: null,
          age_ms: null,
        }),
      })),
    })),
    latency,
    ttft,
    batch_sizes: batchSizes,
    queued: stats.batchers.reduce((sum, b) => sum + b.snapshot.queued, 0),
    routing,
    // The busiest keys by requests and by spend, together (the page sorts them either way).
    top_keys: [
      ...new Set([
        ...[...keys].sort((a, b) => b.requests - a.requests).slice(0, TOP_KEYS),
        ...[...keys].sort((a, b) => b.spend_usd - a.spend_usd).slice(0, TOP_KEYS),
      ]),
    ].sort((a, b) => b.requests - a.requests),
    recent_errors: recentErrors(stats),
  };
}

/** One error of the dashboard's list. */
export interface RecentErrorJson {
  request_id: string;
  at: number;
  key: string;
  model: string;
  region: string;
  status: number;
  /** The error's code (the origin's own where it gave one), or how the request ended. */
  code: string | null;
  outcome: string;
  path: string | null;
}

/**
 * The latest errors: every error answer of the OpenAI API (refusals before any account
 * included, with their codes), joined by request id with what the keys' accounts recorded
 * of them (region, outcome), and the accounts' errors the edge answered with a 200 (a
 * stream cut after its first byte).
 */
function recentErrors(stats: FleetStats): RecentErrorJson[] {
  const names = new Map(stats.keys.map((key) => [key.keyId, key.name || key.keyId]));
  const settled = new Map<string, RecentError & { key: string }>();
  for (const key of stats.keys) {
    for (const e of key.recentErrors)
      settled.set(e.requestId, { ...e, key: key.name || key.keyId });
  }
  const answered: RecentErrorJson[] = stats.answers.errors
    .filter((e) => e.path.startsWith("/v1"))
    .map((e) => {
      const account = settled.get(e.requestId);
      settled.delete(e.requestId);
      return {
        request_id: e.requestId,
        at: e.at,
        key: account?.key ?? (e.keyId === null ? "–" : (names.get(e.keyId) ?? e.keyId)),
        model: account?.model ?? e.model ?? "–",
        region: account?.region ?? "none",
        status: e.status,
        code: e.code === "none" ? (account?.code ?? null) : e.code,
        outcome: account?.outcome ?? "refused",
        path: `${e.method} ${e.path}`,
      };
    });
  const accountOnly = [...settled.values()].map((e) => ({
    request_id: e.requestId,
    at: e.at,
    key: e.key,
    model: e.model,
    region: e.region,
    status: e.status,
    code: e.code,
    outcome: e.outcome,
    path: null,
  }));
  return [...answered, ...accountOnly].sort((a, b) => b.at - a.at).slice(0, ERRORS);
}
