/**
 * Reading an engine's Prometheus metrics (vLLM's names): families summed over their label
 * sets, and the engine's step time from its inter-token latency histogram.
 * See docs/configuration.md, "The origin".
 */

/** A metric family summed over its label sets, and the label sets themselves. */
export interface Scrape {
  text: string;
  sums: Map<string, number>;
  labels: Map<string, Record<string, string>>;
}

/** Parses Prometheus text exposition into per-name sums (engines label by model). */
export function parsePrometheus(text: string): Scrape {
  const sums = new Map<string, number>();
  const labels = new Map<string, Record<string, string>>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/.exec(line);
    if (match === null) continue;
    const name = match[1] ?? "";
    const value = Number(match[3]);
    if (!Number.isFinite(value)) continue;
    sums.set(name, (sums.get(name) ?? 0) + value);
    if (match[2] !== undefined && !labels.has(name)) {
      const set: Record<string, string> = {};
      for (const pair of match[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
        set[pair[1] ?? ""] = pair[2] ?? "";
      }
      labels.set(name, set);
    }
  }
  return { text, sums, labels };
}

/** Inter-token latency histograms, newest name first: an engine step, seen by a sequence. */
const INTER_TOKEN_FAMILIES = [
  "vllm:inter_token_latency_seconds",
  "vllm:time_per_output_token_seconds",
  "sglang:inter_token_latency_seconds",
  "sglang:time_per_output_token_seconds",
];

/**
 * The mean inter-token latency (ms) over the tokens between two scrapes, from the first
 * histogram family both publish; null when no token came between them (or the engine
 * restarted, and its counters with it).
 */
export function meanStepMs(before: Scrape | null, after: Scrape): number | null {
  if (before === null) return null;
  for (const family of INTER_TOKEN_FAMILIES) {
    const count = (scrape: Scrape) => scrape.sums.get(`${family}_count`);
    const sum = (scrape: Scrape) => scrape.sums.get(`${family}_sum`);
    const [c0, c1, s0, s1] = [count(before), count(after), sum(before), sum(after)];
    if (c0 === undefined || c1 === undefined || s0 === undefined || s1 === undefined) continue;
    if (c1 <= c0 || s1 < s0) return null;
    return ((s1 - s0) / (c1 - c0)) * 1000;
  }
  return null;
}
