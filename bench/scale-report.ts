/**
 * The report of `npm run bench:scale` (docs/benchmarks.md, "Scale out"): each phase's
 * streams summed, set against the origin's in the same run, the shard count over time, what
 * one shard carries below the split lag, and the benchmark's targets.
 */
import { fmt, markdownTable, percentile, type TargetResult } from "./lib.ts";
import type { StreamSample } from "./streams-client.ts";

/** How the edge's shards looked at one poll. */
export interface ShardPoll {
  /** Seconds since the run's first phase began. */
  t: number;
  count: number;
  /** Each shard's thread lag (ms), shard 0 first. */
  lagsMs: number[];
  /** Items each shard runs or queues. */
  inFlight: number[];
}

/** One timed stretch of one path at one stream count. */
export interface ScalePhase {
  kind: "capacity" | "scale" | "calm";
  path: "origin" | "edge";
  streams: number;
  seconds: number;
  samples: StreamSample[];
  /** Answered 200 but ended without `[DONE]`, or no answer at all. */
  cut: number;
  /** Answered with another status (a refusal). */
  refused: number;
  firstError: string | null;
  polls: ShardPoll[];
  /** Breakers that opened meanwhile (all origins are healthy). */
  breakerOpenings: number;
  /** Share of the machine's CPU time busy meanwhile (0–1). */
  machineBusy: number;
  /** Cores' worth of CPU the edge's workerd used meanwhile; null when unknown. */
  edgeCores: number | null;
}

/** A phase as the report shows it. */
export interface ScaleRow {
  kind: ScalePhase["kind"];
  path: ScalePhase["path"];
  streams: number;
  completed: number;
  cut: number;
  refused: number;
  tokensPerSecond: number;
  /** Tokens/s over the origin's at the same stream count (scale phases). */
  ratio: number | null;
  shardsMax: number;
  shardsEnd: number;
  lagP50Ms: number;
  lagP95Ms: number;
  lagMaxMs: number;
  breakerOpenings: number;
  machineBusy: number;
  edgeCores: number | null;
  firstError: string | null;
}

function tokensOf(phase: ScalePhase): number {
  return phase.samples.reduce((sum, s) => sum + s.tokens, 0);
}

/** Each phase as a row, the scale phases set against the origin's at the same count. */
export function scaleRows(phases: readonly ScalePhase[]): ScaleRow[] {
  return phases.map((phase) => {
    const tokensPerSecond = tokensOf(phase) / phase.seconds;
    const origin = phases.find(
      (p) => p.kind === "scale" && p.path === "origin" && p.streams === phase.streams,
    );
    const ratio =
      phase.kind === "scale" && origin !== undefined && origin !== phase
        ? tokensPerSecond / (tokensOf(origin) / origin.seconds)
        : null;
    const lags = phase.polls.flatMap((p) => p.lagsMs).sort((a, b) => a - b);
    const counts = phase.polls.map((p) => p.count);
    return {
      kind: phase.kind,
      path: phase.path,
      streams: phase.streams,
      completed: phase.samples.length,
      cut: phase.cut,
      refused: phase.refused,
      tokensPerSecond,
      ratio,
      shardsMax: counts.length === 0 ? 0 : Math.max(...counts),
      shardsEnd: counts.at(-1) ?? 0,
      lagP50Ms: lags.length === 0 ? Number.NaN : percentile(lags, 50),
      lagP95Ms: lags.length === 0 ? Number.NaN : percentile(lags, 95),
      lagMaxMs: lags.at(-1) ?? Number.NaN,
      breakerOpenings: phase.breakerOpenings,
      machineBusy: phase.machineBusy,
      edgeCores: phase.edgeCores,
      firstError: phase.firstError,
    };
  });
}

/** The rows as the benchmark prints them. */
export function scaleTable(rows: readonly ScaleRow[]): string {
  return markdownTable(
    [
      "phase",
      "path",
      "streams",
      "done",
      "cut",
      "refused",
      "tokens/s",
      "/ origin",
      "shards max / end",
      "shard lag p50 / p95 / max ms",
      "breakers opened",
      "machine CPU busy",
      "edge cores",
    ],
    rows.map((r) => [
      r.kind,
      r.path,
      String(r.streams),
      String(r.completed),
      String(r.cut),
      String(r.refused),
      fmt(r.tokensPerSecond, 0),
      r.ratio === null ? "" : `${fmt(r.ratio)}×`,
      r.path === "origin" ? "" : `${r.shardsMax} / ${r.shardsEnd}`,
      r.path === "origin"
        ? ""
        : `${fmt(r.lagP50Ms, 1)} / ${fmt(r.lagP95Ms, 1)} / ${fmt(r.lagMaxMs, 1)}`,
      r.path === "origin" ? "" : String(r.breakerOpenings),
      `${fmt(r.machineBusy * 100, 0)}%`,
      r.edgeCores === null ? "–" : fmt(r.edgeCores),
    ]),
  );
}

/** What one shard carries: the capacity phases (one shard, fixed), with whether it stayed under the lag. */
export function capacityTable(rows: readonly ScaleRow[], splitLagMs: number): string {
  return markdownTable(
    ["streams", "tokens/s (one shard)", "lag p50 ms", "lag p95 ms", `p95 < ${splitLagMs} ms`],
    rows
      .filter((r) => r.kind === "capacity")
      .map((r) => [
        String(r.streams),
        fmt(r.tokensPerSecond, 0),
        fmt(r.lagP50Ms, 1),
        fmt(r.lagP95Ms, 1),
        r.lagP95Ms < splitLagMs ? "yes" : "no",
      ]),
  );
}

/** The shard count over the run: each change, with the time it was first seen. */
export function shardChanges(polls: readonly ShardPoll[]): { t: number; count: number }[] {
  const changes: { t: number; count: number }[] = [];
  for (const poll of polls) {
    if (changes.at(-1)?.count !== poll.count) changes.push({ t: poll.t, count: poll.count });
  }
  return changes;
}

/** The benchmark's targets (docs/benchmarks.md, "Scale out"). */
export function scaleTargets(
  rows: readonly ScaleRow[],
  levels: readonly number[],
  splitLagMs: number,
  changes: readonly { t: number; count: number }[],
): Record<string, TargetResult> {
  const targets: Record<string, TargetResult> = {};
  for (const streams of levels) {
    const edge = rows.find((r) => r.kind === "scale" && r.path === "edge" && r.streams === streams);
    if (edge === undefined) continue;
    targets[`cut streams, ${streams} streams`] = {
      value: edge.cut,
      target: "0",
      met: edge.cut === 0,
    };
    targets[`healthy breakers opened, ${streams} streams`] = {
      value: edge.breakerOpenings,
      target: "0",
      met: edge.breakerOpenings === 0,
    };
    const ratio = edge.ratio ?? Number.NaN;
    targets[`tokens/s / origin, ${streams} streams`] = {
      value: ratio,
      target: ">= 0.6",
      met: ratio >= 0.6,
    };
  }
  const counts = changes.map((c) => c.count);
  const peak = Math.max(1, ...counts);
  const lagged = rows.some(
    (r) => r.kind === "scale" && r.path === "edge" && r.lagP95Ms >= splitLagMs,
  );
  targets["shards at the peak (split when one lags)"] = {
    value: peak,
    target: lagged ? "> 1" : "(no shard lagged)",
    met: !lagged || peak > 1,
  };
  const merged = counts.some((c, i) => i > 0 && c < (counts[i - 1] ?? c));
  targets["shards after the calm phase (merged back)"] = {
    value: counts.at(-1) ?? 1,
    target: peak > 1 ? `< ${peak}` : "(never split)",
    met: peak === 1 || merged,
  };
  const under = rows.filter((r) => r.kind === "capacity" && r.lagP95Ms < splitLagMs);
  targets[`tokens/s one shard carries at lag p95 < ${splitLagMs} ms`] = {
    value: Math.max(0, ...under.map((r) => r.tokensPerSecond)),
    target: "(reported)",
    met: true,
  };
  return targets;
}
