/**
 * The origin's own Prometheus counters (batches, items, cancellations, faults) and
 * GPU gauges, rendered beside the engine's vLLM-named metrics in `GET /metrics`.
 * See docs/configuration.md, "The origin".
 */
import type { FaultKind } from "./faults.ts";
import type { GpuReading, GpuSnapshot } from "./gpu.ts";
import type { ItemOutcome } from "../contracts/protocol/schema.ts";
import type { RefusedConnections } from "./connection-limits.ts";

/** Why the origin aborted an item. */
export type AbortReason = "cancel" | "client" | "timeout" | "shutdown";

/** Where an item came in. */
export type ItemRoute = "chat" | "completions" | "responses" | "embeddings" | "batch";

/** Counters the origin keeps; plain numbers, read when `/metrics` is scraped. */
export interface OriginCounters {
  batches: number;
  /** Of them, raw batches (one item, its body unframed). */
  rawBatches: number;
  batchItems: number;
  requests: Record<Exclude<ItemRoute, "batch">, number>;
  inFlight: number;
  outcomes: Record<ItemOutcome, number>;
  /** Background items answered again from a kept answer, not run. */
  replayed: number;
  cancellations: Record<AbortReason, number>;
  /** Connections turned away because `maxConnections` were open. */
  connectionsRefused: RefusedConnections;
  /** Outcome lookups answered (`/v1/batch/outcomes`). */
  outcomeLookups: number;
}

/** Fresh zeroed counters. */
export function createOriginCounters(): OriginCounters {
  return {
    batches: 0,
    rawBatches: 0,
    batchItems: 0,
    requests: { chat: 0, completions: 0, responses: 0, embeddings: 0 },
    inFlight: 0,
    outcomes: { ok: 0, error: 0, cancelled: 0, timeout: 0 },
    replayed: 0,
    cancellations: { cancel: 0, client: 0, timeout: 0, shutdown: 0 },
    connectionsRefused: { busy: 0, closed: 0 },
    outcomeLookups: 0,
  };
}

/** Escapes a Prometheus label value (backslash, quote, newline). */
function label(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}

class MetricWriter {
  readonly lines: string[] = [];
  family(name: string, type: "counter" | "gauge", help: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  }
  sample(name: string, value: number, labels: Record<string, string> = {}): void {
    const pairs = Object.entries(labels).map(([k, v]) => `${k}="${label(v)}"`);
    this.lines.push(`${name}${pairs.length > 0 ? `{${pairs.join(",")}}` : ""} ${value}`);
  }
}

/** A GPU gauge: its name, help, and the reading it shows (null: not read). */
type GpuGauge = [name: string, help: string, pick: (g: GpuReading) => number | null];

/** Each gauge's family and one sample per GPU whose reading exists, labelled by `labels`. */
function writeGpuGauges(
  w: MetricWriter,
  gauges: readonly GpuGauge[],
  gpus: readonly GpuReading[],
  labels: (g: GpuReading) => Record<string, string>,
): void {
  for (const [name, help, pick] of gauges) {
    w.family(name, "gauge", help);
    for (const g of gpus) {
      const value = pick(g);
      if (value !== null) w.sample(name, value, labels(g));
    }
  }
}

function mib(bytes: number | null): number | null {
  return bytes === null ? null : Math.round(bytes / 1048576);
}

/** Inputs of {@link renderOriginMetrics}. */
export interface OriginMetricsInput {
  originId: string;
  region: string | undefined;
  counters: OriginCounters;
  faults: Readonly<Record<FaultKind, number>>;
  gpu: GpuSnapshot;
  /** Background items waiting for a slot and running, and those preempted since start. */
  background: {
    queued: number;
    running: number;
    preemptions: number;
    okRuns: number;
    rerunTokens: number;
  };
}

/** Renders the origin's metrics as Prometheus text (no trailing newline). */
export function renderOriginMetrics(input: OriginMetricsInput): string {
  const { counters, gpu } = input;
  const w = new MetricWriter();
  const originLabels: Record<string, string> = { origin: input.originId };
  if (input.region !== undefined) originLabels.region = input.region;

  w.family("warmgate_origin_info", "gauge", "Origin identity; always 1.");
  w.sample("warmgate_origin_info", 1, originLabels);

  w.family("warmgate_origin_batches_total", "counter", "Batch requests accepted.");
  w.sample("warmgate_origin_batches_total", counters.batches);
  w.family(
    "warmgate_origin_raw_batches_total",
    "counter",
    "Raw batches accepted (of all batches).",
  );
  w.sample("warmgate_origin_raw_batches_total", counters.rawBatches);
  w.family("warmgate_origin_batch_items_total", "counter", "Items received in batches.");
  w.sample("warmgate_origin_batch_items_total", counters.batchItems);

  w.family("warmgate_origin_requests_total", "counter", "Plain OpenAI requests, by route.");
  for (const [route, n] of Object.entries(counters.requests)) {
    w.sample("warmgate_origin_requests_total", n, { route });
  }
  w.family("warmgate_origin_items_in_flight", "gauge", "Items (plain or batched) running now.");
  w.sample("warmgate_origin_items_in_flight", counters.inFlight);

  w.family(
    "warmgate_origin_outcome_lookups_total",
    "counter",
    "Outcome lookups answered (/v1/batch/outcomes), each about one or more requests.",
  );
  w.sample("warmgate_origin_outcome_lookups_total", counters.outcomeLookups);
  w.family("warmgate_origin_item_outcomes_total", "counter", "Finished items, by outcome.");
  for (const [outcome, n] of Object.entries(counters.outcomes)) {
    w.sample("warmgate_origin_item_outcomes_total", n, { outcome });
  }
  w.family(
    "warmgate_origin_items_replayed_total",
    "counter",
    "Background items answered again from their kept answer, not run.",
  );
  w.sample("warmgate_origin_items_replayed_total", counters.replayed);
  const { background } = input;
  w.family("warmgate_origin_background_items", "gauge", "Background items, by state.");
  w.sample("warmgate_origin_background_items", background.queued, { state: "queued" });
  w.sample("warmgate_origin_background_items", background.running, { state: "running" });
  w.family(
    "warmgate_origin_background_preemptions_total",
    "counter",
    "Background items stopped to give their slot to an interactive item (they run again).",
  );
  w.sample("warmgate_origin_background_preemptions_total", background.preemptions);
  w.family(
    "warmgate_origin_background_ok_runs_total",
    "counter",
    "Background items run to the end ok (an answer sent again from its kept copy is no run).",
  );
  w.sample("warmgate_origin_background_ok_runs_total", background.okRuns);
  w.family(
    "warmgate_origin_background_rerun_tokens_total",
    "counter",
    "Completion tokens preempted background items had generated, thrown away and run again.",
  );
  w.sample("warmgate_origin_background_rerun_tokens_total", background.rerunTokens);
  w.family("warmgate_origin_cancellations_total", "counter", "Items aborted, by reason.");
  for (const [reason, n] of Object.entries(counters.cancellations)) {
    w.sample("warmgate_origin_cancellations_total", n, { reason });
  }
  w.family(
    "warmgate_origin_connections_refused_total",
    "counter",
    "Connections turned away because the most the origin serves were open: answered 503 (busy) or closed unanswered past four times that many (closed).",
  );
  for (const [how, n] of Object.entries(counters.connectionsRefused)) {
    w.sample("warmgate_origin_connections_refused_total", n, { how });
  }
  w.family("warmgate_origin_fault_injections_total", "counter", "Injected faults, by kind.");
  for (const [kind, n] of Object.entries(input.faults)) {
    w.sample("warmgate_origin_fault_injections_total", n, { kind });
  }

  w.family("warmgate_origin_gpu_available", "gauge", "1 when nvidia-smi readings are present.");
  w.sample("warmgate_origin_gpu_available", gpu.available ? 1 : 0);
  if (gpu.available) {
    const gauges: GpuGauge[] = [
      [
        "warmgate_origin_gpu_utilization_percent",
        "GPU utilisation, percent.",
        (g) => g.utilization_percent,
      ],
      [
        "warmgate_origin_gpu_memory_used_bytes",
        "GPU memory in use, bytes.",
        (g) => g.memory_used_bytes,
      ],
      [
        "warmgate_origin_gpu_memory_total_bytes",
        "GPU memory in all, bytes.",
        (g) => g.memory_total_bytes,
      ],
      [
        "warmgate_origin_gpu_temperature_celsius",
        "GPU temperature, Celsius.",
        (g) => g.temperature_celsius,
      ],
      ["warmgate_origin_gpu_power_watts", "GPU power draw, watts.", (g) => g.power_watts],
    ];
    writeGpuGauges(w, gauges, gpu.gpus, (g) => ({ gpu: String(g.index), name: g.name }));
    // The same readings under NVIDIA DCGM-exporter's names, for its dashboards and alerts.
    const dcgm: GpuGauge[] = [
      ["DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", (g) => g.utilization_percent],
      ["DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", (g) => mib(g.memory_used_bytes)],
      [
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        (g) =>
          g.memory_total_bytes === null || g.memory_used_bytes === null
            ? null
            : mib(g.memory_total_bytes - g.memory_used_bytes),
      ],
      ["DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", (g) => g.temperature_celsius],
      ["DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", (g) => g.power_watts],
    ];
    writeGpuGauges(w, dcgm, gpu.gpus, (g) => ({ gpu: String(g.index), modelName: g.name }));
  } else {
    w.family(
      "warmgate_origin_gpu_unavailable_info",
      "gauge",
      "Why there are no GPU readings (no nvidia-smi, no GPU); always 1.",
    );
    w.sample("warmgate_origin_gpu_unavailable_info", 1, { reason: gpu.reason });
  }
  return w.lines.join("\n");
}
