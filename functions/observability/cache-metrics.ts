/**
 * The response cache's figures as Prometheus families (docs/metrics.md, docs/cache.md):
 * hits and misses, bytes and tokens saved, per model and per key, from what the keys'
 * accounts counted when each request settled.
 */
import { Metric } from "../../contracts/prometheus.ts";
import type { KeyMetrics } from "../../durable-objects/key-account/metrics.ts";

/** The cache families for every key's series. */
export function cacheFamilies(keys: readonly KeyMetrics[]): Metric[] {
  const requests = new Metric(
    "warmgate_cache_requests_total",
    "counter",
    "Requests that used the response cache, by model and result (hit, miss).",
  );
  const bytes = new Metric(
    "warmgate_cache_saved_bytes_total",
    "counter",
    "Bytes answered from the response cache, by model.",
  );
  const tokens = new Metric(
    "warmgate_cache_saved_tokens_total",
    "counter",
    "Prompt and completion tokens the response cache's hits did not generate again, by model.",
  );
  const keyRequests = new Metric(
    "warmgate_key_cache_requests_total",
    "counter",
    "Requests that used the response cache, per key and result (hit, miss).",
  );
  const keyBytes = new Metric(
    "warmgate_key_cache_saved_bytes_total",
    "counter",
    "Bytes answered from the response cache, per key.",
  );
  const keyTokens = new Metric(
    "warmgate_key_cache_saved_tokens_total",
    "counter",
    "Tokens the response cache's hits did not generate again, per key.",
  );
  for (const key of keys) {
    const totals = { hits: 0, misses: 0, bytesSaved: 0, tokensSaved: 0 };
    for (const s of key.series) {
      if (s.cache === undefined) continue;
      requests.inc({ model: s.model, result: "hit" }, s.cache.hits);
      requests.inc({ model: s.model, result: "miss" }, s.cache.misses);
      bytes.inc({ model: s.model }, s.cache.bytesSaved);
      tokens.inc({ model: s.model }, s.cache.tokensSaved);
      totals.hits += s.cache.hits;
      totals.misses += s.cache.misses;
      totals.bytesSaved += s.cache.bytesSaved;
      totals.tokensSaved += s.cache.tokensSaved;
    }
    if (totals.hits + totals.misses === 0) continue;
    const labels = { key: key.keyId, name: key.name };
    keyRequests.inc({ ...labels, result: "hit" }, totals.hits);
    keyRequests.inc({ ...labels, result: "miss" }, totals.misses);
    keyBytes.inc(labels, totals.bytesSaved);
    keyTokens.inc(labels, totals.tokensSaved);
  }
  return [requests, bytes, tokens, keyRequests, keyBytes, keyTokens];
}
