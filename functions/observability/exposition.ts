/**
 * The fleet's figures as Prometheus text (docs/metrics.md): requests, latency, time to
 * first token, tokens, spend and the response cache from the key accounts; batches, batch sizes, queue waits,
 * queue depths, origin load and routing hit rates from the Batchers; breaker states.
 * Names are stable; labels are the model, region, status class, tier, lane and origin.
 */
import { Histogram, Metric, renderFamilies } from "../../contracts/prometheus.ts";
import { picosToUsd } from "../../contracts/pricing.ts";
import { DURATION_BOUNDS_S, TTFT_BOUNDS_S } from "../../durable-objects/key-account/types.ts";
import { QUEUE_WAIT_BOUNDS_MS } from "../../durable-objects/batcher/types.ts";
import { cacheFamilies } from "./cache-metrics.ts";
import { BATCH_SIZE_BOUNDS, type FleetStats, batchSizeCounts, originShares } from "./collect.ts";

/** `warmgate_breaker_state`'s values. */
export const BREAKER_STATE_VALUES = { closed: 0, half_open: 1, open: 2 } as const;

/** Renders a collection as one exposition document. */
export function renderFleet(stats: FleetStats): string {
  const requests = new Metric(
    "warmgate_requests_total",
    "counter",
    "Requests that reached their key's account (admitted, or refused by its limits), by model, serving region, status class and key tier.",
  );
  const answers = new Metric(
    "warmgate_responses_total",
    "counter",
    "Every answer the edge gave, refusals before any key's account included, by route group (v1, admin, other), status class and error code (the origin's own where it gave one).",
  );
  for (const s of stats.answers.series) {
    answers.inc({ route: s.route, status_class: s.statusClass, code: s.code }, s.count);
  }
  const duration = new Histogram(
    "warmgate_request_duration_seconds",
    "From the edge receiving a request to its end, by model and region.",
    DURATION_BOUNDS_S,
  );
  const ttft = new Histogram(
    "warmgate_time_to_first_token_seconds",
    "From the edge receiving a streamed request to its first body bytes leaving for the client.",
    TTFT_BOUNDS_S,
  );
  const tokens = new Metric(
    "warmgate_tokens_total",
    "counter",
    "Tokens billed, by model and kind (prompt, cached, completion).",
  );
  const spend = new Metric(
    "warmgate_spend_usd_total",
    "counter",
    "Billed cost in US dollars, by model and key tier.",
  );
  const keyRequests = new Metric("warmgate_key_requests_total", "counter", "Requests per key.");
  const keySpend = new Metric(
    "warmgate_key_spend_usd_total",
    "counter",
    "Billed cost per key in US dollars.",
  );
  const attempts = new Metric(
    "warmgate_upstream_attempts_total",
    "counter",
    "Origins tried for requests, by model and serving region.",
  );
  const retries = new Metric(
    "warmgate_upstream_retries_total",
    "counter",
    "Origins tried after a failure before the first byte, by model and serving region.",
  );
  const budgetAlerts = new Metric(
    "warmgate_budget_alerts_total",
    "counter",
    "Soft-budget alerts per key (or team) and period: raised (once per window), retried, delivered, dropped.",
  );
  for (const team of stats.teams) {
    for (const alert of team.budgetAlerts) {
      budgetAlerts.inc(
        { team: team.teamId, period: alert.period, outcome: alert.outcome },
        alert.count,
      );
    }
  }
  for (const key of stats.keys) {
    for (const alert of key.budgetAlerts) {
      budgetAlerts.inc(
        { key: key.keyId, period: alert.period, outcome: alert.outcome },
        alert.count,
      );
    }
    let keyCount = 0;
    let keyPicos = 0;
    for (const s of key.series) {
      requests.inc(
        { model: s.model, region: s.region, status_class: s.statusClass, tier: key.tier },
        s.requests,
      );
      duration.add(
        { model: s.model, region: s.region },
        s.durationS.counts,
        s.durationS.sum,
        s.durationS.count,
      );
      if (s.ttftS.count > 0)
        ttft.add({ model: s.model, region: s.region }, s.ttftS.counts, s.ttftS.sum, s.ttftS.count);
      tokens.inc({ model: s.model, kind: "prompt" }, s.promptTokens);
      tokens.inc({ model: s.model, kind: "cached" }, s.cachedTokens);
      tokens.inc({ model: s.model, kind: "completion" }, s.completionTokens);
      spend.inc({ model: s.model, tier: key.tier }, picosToUsd(s.spendPicos));
      attempts.inc({ model: s.model, region: s.region }, s.attempts);
      retries.inc({ model: s.model, region: s.region }, s.retries);
      keyCount += s.requests;
      keyPicos += s.spendPicos;
    }
    keyRequests.inc({ key: key.keyId, name: key.name }, keyCount);
    keySpend.inc({ key: key.keyId, name: key.name }, picosToUsd(keyPicos));
  }

  const batches = new Metric(
    "warmgate_batches_total",
    "counter",
    "Upstream calls a Batcher made, by why they left (since the Batcher started).",
  );
  const batchSize = new Histogram(
    "warmgate_batch_size",
    "Requests per upstream call.",
    BATCH_SIZE_BOUNDS,
  );
  const queueWait = new Histogram(
    "warmgate_queue_wait_seconds",
    "From a Batcher admitting a request to its upstream call leaving.",
    QUEUE_WAIT_BOUNDS_MS.map((ms) => ms / 1000),
  );
  const depth = new Metric(
    "warmgate_queue_depth",
    "gauge",
    "Requests waiting in a Batcher's lane (0 is the highest priority).",
  );
  const running = new Metric(
    "warmgate_origin_running",
    "gauge",
    "Sequences the origin's engine runs, from its last load report.",
  );
  const waiting = new Metric(
    "warmgate_origin_waiting",
    "gauge",
    "Sequences waiting in the origin's engine.",
  );
  const kvUsage = new Metric(
    "warmgate_origin_kv_usage_ratio",
    "gauge",
    "Share of the engine's KV cache in use.",
  );
  const prefixHit = new Metric(
    "warmgate_origin_prefix_hit_ratio",
    "gauge",
    "Share of prompt tokens the engine's prefix cache has served since it started.",
  );
  const hitRate = new Metric(
    "warmgate_routing_hit_rate",
    "gauge",
    "Share of prompt tokens served from cache: predicted by the router, reported by the engines.",
  );
  const seenOrigins = new Set<string>();
  for (const b of stats.batchers) {
    const where = { region: b.region, model: b.model, shard: String(b.shard) };
    const { counters } = b.snapshot;
    for (const [reason, count] of Object.entries(counters.batches))
      batches.inc({ ...where, reason }, count);
    const sizes = batchSizeCounts(counters.batchSizes);
    batchSize.add(
      { region: b.region, model: b.model },
      sizes.counts,
      counters.batchItems,
      sizes.calls,
    );
    const wait = counters.queueWaitMs;
    queueWait.add({ region: b.region, model: b.model }, wait.counts, wait.sum / 1000, wait.count);
    b.snapshot.lanes.forEach((n, lane) => depth.set({ ...where, lane: String(lane) }, n));
    for (const [origin, report] of Object.entries(b.snapshot.origins)) {
      if (report === null || seenOrigins.has(origin)) continue;
      seenOrigins.add(origin);
      const labels = { region: b.region, origin };
      const shares = originShares(report, b.reportTtlMs);
      running.set(labels, shares.running);
      waiting.set(labels, shares.waiting);
      kvUsage.set(labels, shares.kvUsage);
      if (shares.prefixHit !== null) prefixHit.set(labels, shares.prefixHit);
    }
    const routing = b.snapshot.routing;
    if (routing !== null) {
      if (routing.hit_rate.predicted !== null)
        hitRate.set({ ...where, kind: "predicted" }, routing.hit_rate.predicted);
      if (routing.hit_rate.reported !== null)
        hitRate.set({ ...where, kind: "reported" }, routing.hit_rate.reported);
    }
  }

  const breaker = new Metric(
    "warmgate_breaker_state",
    "gauge",
    "An origin's circuit breaker: 0 closed, 1 half-open, 2 open.",
  );
  for (const view of stats.breakers) {
    breaker.set({ region: view.region, origin: view.origin }, BREAKER_STATE_VALUES[view.state]);
  }
  const info = new Metric(
    "warmgate_metrics_keys_truncated",
    "gauge",
    "1 when more keys exist than one scrape reads.",
  );
  info.set({}, stats.keysTruncated ? 1 : 0);

  return renderFamilies([
    requests,
    answers,
    duration,
    ttft,
    tokens,
    spend,
    keyRequests,
    keySpend,
    budgetAlerts,
    ...cacheFamilies(stats.keys),
    attempts,
    retries,
    batches,
    batchSize,
    queueWait,
    depth,
    running,
    waiting,
    kvUsage,
    prefixHit,
    hitRate,
    breaker,
    info,
  ]);
}
