/**
 * The dashboard's view of a collection (docs/metrics.md, "Dashboard"): regions and their
 * origins with breaker state, load, KV usage and prefix-hit rate; latency and
 * time-to-first-token histograms (the page turns their differences between two polls
 * into percentiles over time); batch sizes; the keys with most requests; recent errors.
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
  let requests = 0;
  let errors = 0;
  let spendPicos = 0;
  const keys = stats.keys.map((key) => {
    let n = 0;
    let picos = 0;
    for (const s of key.series) {
      addInto(latency, s.durationS);
      addInto(ttft, s.ttftS);
      n += s.requests;
      picos += s.spendPicos;
      if (s.statusClass !== "2xx") errors += s.requests;
    }
    requests += n;
    spendPicos += picos;
    return {
      id: key.keyId,
      name: key.name,
      tier: key.tier,
      requests: n,
      spend_usd: picosToUsd(picos),
    };
  });
  const recent: (RecentError & { key: string })[] = stats.keys
    .flatMap((key) => key.recentErrors.map((e) => ({ ...e, key: key.name || key.keyId })))
    .sort((a, b) => b.at - a.at)
    .slice(0, ERRORS);

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
      const shares = originShares(report);
      load.set(origin, {
        running: report.running,
        waiting: report.waiting,
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
    recent_errors: recent,
  };
}
