/**
 * Prometheus text exposition (format 0.0.4): counter, gauge and cumulative histogram
 * families keyed by label sets, for the edge's `/metrics` and the origins' (docs/metrics.md).
 * Written here rather than taken from prom-client, which needs Node's runtime (cluster,
 * perf_hooks) that the Worker does not run with.
 */

/** Label names to values. */
export type Labels = Readonly<Record<string, string>>;

function escapeLabel(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}

function renderLabels(labels: Labels): string {
  const pairs = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabel(v)}"`);
  return pairs.length === 0 ? "" : `{${pairs.join(",")}}`;
}

function labelKey(labels: Labels): string {
  return JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)));
}

/** The `status_class` label of an HTTP status: `2xx`, `4xx`, `5xx`, … */
export function statusClassOf(status: number): string {
  return `${Math.min(5, Math.max(1, Math.floor(status / 100)))}xx`;
}

/** Observations with per-bucket (not cumulative) counts; past the last bound only `count`. */
export interface HistogramData {
  counts: number[];
  sum: number;
  count: number;
}

/** A histogram with `bounds` and no observations. */
export function emptyHistogram(bounds: readonly number[]): HistogramData {
  return { counts: bounds.map(() => 0), sum: 0, count: 0 };
}

/** Adds one observation to a histogram with `bounds`. */
export function observe(histogram: HistogramData, bounds: readonly number[], value: number): void {
  const at = bounds.findIndex((bound) => value <= bound);
  if (at >= 0) histogram.counts[at] = (histogram.counts[at] ?? 0) + 1;
  histogram.sum += value;
  histogram.count += 1;
}

/** Renders families as one exposition document, ending in a newline. */
export function renderFamilies(families: readonly { render(): string[] }[]): string {
  return families.flatMap((family) => family.render()).join("\n") + "\n";
}

function formatValue(value: number): string {
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

/** A counter or gauge family. */
export class Metric {
  readonly name: string;
  readonly type: "counter" | "gauge";
  readonly help: string;
  readonly #values = new Map<string, { labels: Labels; value: number }>();

  constructor(name: string, type: "counter" | "gauge", help: string) {
    this.name = name;
    this.type = type;
    this.help = help;
  }

  /** Adds to the series with `labels` (creating it at zero). */
  inc(labels: Labels, by = 1): void {
    const key = labelKey(labels);
    const entry = this.#values.get(key);
    if (entry === undefined) this.#values.set(key, { labels, value: by });
    else entry.value += by;
  }

  /** Sets the series with `labels`. */
  set(labels: Labels, value: number): void {
    this.#values.set(labelKey(labels), { labels, value });
  }

  /** Exposition lines, HELP and TYPE first. */
  render(): string[] {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.type}`];
    for (const { labels, value } of this.#values.values()) {
      lines.push(`${this.name}${renderLabels(labels)} ${formatValue(value)}`);
    }
    return lines;
  }
}

interface Series {
  labels: Labels;
  counts: number[];
  sum: number;
  count: number;
}

/** A cumulative histogram family with fixed bucket bounds. */
export class Histogram {
  readonly name: string;
  readonly help: string;
  readonly buckets: readonly number[];
  readonly #series = new Map<string, Series>();

  constructor(name: string, help: string, buckets: readonly number[]) {
    this.name = name;
    this.help = help;
    this.buckets = [...buckets].sort((a, b) => a - b);
  }

  /** Records one observation. */
  observe(labels: Labels, value: number): void {
    const key = labelKey(labels);
    let series = this.#series.get(key);
    if (series === undefined) {
      series = { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 };
      this.#series.set(key, series);
    }
    for (let i = 0; i < this.buckets.length; i++) {
      if (value <= (this.buckets[i] ?? Infinity)) series.counts[i] = (series.counts[i] ?? 0) + 1;
    }
    series.sum += value;
    series.count++;
  }

  /** Adds counts gathered elsewhere (per bucket, not cumulative), with their sum and count. */
  add(labels: Labels, counts: readonly number[], sum: number, count: number): void {
    const key = labelKey(labels);
    let series = this.#series.get(key);
    if (series === undefined) {
      series = { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 };
      this.#series.set(key, series);
    }
    let cumulative = 0;
    for (let i = 0; i < this.buckets.length; i++) {
      cumulative += counts[i] ?? 0;
      series.counts[i] = (series.counts[i] ?? 0) + cumulative;
    }
    series.sum += sum;
    series.count += count;
  }

  /** Makes a series exist (all zero) so scrapes show it before the first observation. */
  touch(labels: Labels): void {
    const key = labelKey(labels);
    if (!this.#series.has(key)) {
      this.#series.set(key, { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 });
    }
  }

  /** Exposition lines: cumulative `_bucket`s ending in `+Inf`, then `_sum` and `_count`. */
  render(): string[] {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`];
    for (const series of this.#series.values()) {
      this.buckets.forEach((bound, i) => {
        const labels = renderLabels({ ...series.labels, le: formatValue(bound) });
        lines.push(`${this.name}_bucket${labels} ${series.counts[i] ?? 0}`);
      });
      lines.push(
        `${this.name}_bucket${renderLabels({ ...series.labels, le: "+Inf" })} ${series.count}`,
      );
      lines.push(`${this.name}_sum${renderLabels(series.labels)} ${series.sum}`);
      lines.push(`${this.name}_count${renderLabels(series.labels)} ${series.count}`);
    }
    return lines;
  }
}
