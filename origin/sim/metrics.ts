/**
 * The simulated engine's Prometheus metrics, under vLLM's names and bucket bounds, so that
 * dashboards and scrapers built for vLLM read them unchanged (docs/configuration.md).
 */
import { Histogram, Metric } from "../../contracts/prometheus.ts";
import type { SimModel } from "./request.ts";

// vLLM's bucket bounds, so dashboards built for vLLM read these unchanged.
const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
  160, 640, 2560,
];
const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
];
const E2E_BUCKETS = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];

/** Every metric the engine keeps, by vLLM's name. */
export class SimMetrics {
  readonly running = new Metric(
    "vllm:num_requests_running",
    "gauge",
    "Number of requests in model execution batches.",
  );
  readonly waiting = new Metric(
    "vllm:num_requests_waiting",
    "gauge",
    "Number of requests waiting to be processed.",
  );
  readonly kvUsage = new Metric(
    "vllm:kv_cache_usage_perc",
    "gauge",
    "KV-cache usage. 1 means 100 percent usage.",
  );
  readonly prefixQueries = new Metric(
    "vllm:prefix_cache_queries_total",
    "counter",
    "Prefix cache queries, in terms of number of queried tokens.",
  );
  readonly prefixHits = new Metric(
    "vllm:prefix_cache_hits_total",
    "counter",
    "Prefix cache hits, in terms of number of cached tokens.",
  );
  readonly promptTokens = new Metric(
    "vllm:prompt_tokens_total",
    "counter",
    "Number of prefill tokens processed.",
  );
  readonly generationTokens = new Metric(
    "vllm:generation_tokens_total",
    "counter",
    "Number of generation tokens processed.",
  );
  readonly preemptions = new Metric(
    "vllm:num_preemptions_total",
    "counter",
    "Cumulative number of preemption from the engine.",
  );
  readonly success = new Metric(
    "vllm:request_success_total",
    "counter",
    "Count of successfully processed requests.",
  );
  readonly ttft = new Histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    TTFT_BUCKETS,
  );
  readonly itl = new Histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    ITL_BUCKETS,
  );
  readonly e2e = new Histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    E2E_BUCKETS,
  );

  constructor(models: readonly SimModel[]) {
    for (const model of models) {
      const labels = { model_name: model.id };
      for (const metric of [
        this.prefixQueries,
        this.prefixHits,
        this.promptTokens,
        this.generationTokens,
        this.preemptions,
      ]) {
        metric.inc(labels, 0);
      }
      for (const reason of ["stop", "length", "abort"])
        this.success.inc({ ...labels, finished_reason: reason }, 0);
      for (const histogram of [this.ttft, this.itl, this.e2e]) histogram.touch(labels);
    }
  }

  /** The metrics in Prometheus text, with the current gauges per model. */
  render(
    models: readonly SimModel[],
    running: ReadonlyMap<string, number>,
    waiting: ReadonlyMap<string, number>,
    kvUsage: number,
  ): string {
    for (const model of models) {
      const labels = { model_name: model.id };
      this.running.set(labels, running.get(model.id) ?? 0);
      this.waiting.set(labels, waiting.get(model.id) ?? 0);
      // One KV pool backs every model the engine serves.
      this.kvUsage.set(labels, kvUsage);
    }
    return [
      this.running,
      this.waiting,
      this.kvUsage,
      this.prefixQueries,
      this.prefixHits,
      this.promptTokens,
      this.generationTokens,
      this.preemptions,
      this.success,
      this.ttft,
      this.itl,
      this.e2e,
    ]
      .flatMap((metric) => metric.render())
      .join("\n");
  }
}
