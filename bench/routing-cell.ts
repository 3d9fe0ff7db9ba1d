/**
 * What one cell of `npm run bench:routing` runs and measures (docs/benchmarks.md,
 * "Routing"): the policies compared, a cell's options, its figures and, where the busiest
 * origin is killed mid-run, what that cut.
 */
import type { RoutingSection } from "../contracts/config/routing.ts";
import type { LatencySummary } from "./lib.ts";
import type { Workload } from "./routing-workloads.ts";

export const POLICIES = ["round-robin", "least-loaded", "prefix-hash", "warmgate"] as const;
export type PolicyName = (typeof POLICIES)[number];

/** What one cell runs. */
export interface CellOptions {
  workload: Workload;
  policy: PolicyName;
  origins: number;
  /** Requests (or sessions) started per second of engine time. */
  rate: number;
  timeScale: number;
  /** Routers placing alternate requests, each with an index of its own (warmgate only). */
  edges?: 1 | 2;
  /** The router's `routing` settings (defaults where absent). */
  routing?: RoutingSection;
  /**
   * Kill the busiest origin (SIGKILL) at the first arrival from this share of the
   * workload's sessions on at which at least one stream per origin is past its first byte.
   */
  killAt?: number;
}

/**
 * What killing the busiest origin did: the streams past their first byte (a stream not yet
 * started fails over at the edge; one started is cut) on each origin at the kill, and what
 * befell those on the killed one.
 */
export interface KillResult {
  origin: string;
  /** Streams past their first byte on each origin at the kill, in origin order. */
  streaming: number[];
  /** Streams in flight on each origin at the kill, started or not. */
  inFlight: number[];
  /** Streams the kill broke off after their first byte. */
  cut: number;
  /** Requests on the killed origin that had no byte yet and went to another origin. */
  failedOver: number;
}

/** What one cell measured; times in engine ms. */
export interface CellResult {
  workload: string;
  policy: PolicyName;
  origins: number;
  rate: number;
  requests: number;
  failures: number;
  hitRate: number;
  ceiling: number;
  ttft: LatencySummary;
  /** Completion tokens per second of engine time, from the first request to the last answer. */
  throughput: number;
  /** Most requests one origin served over the mean. */
  imbalance: number;
  /** Most completion tokens one origin generated over the mean. */
  decodeImbalance: number;
  /**
   * Share of the streams in flight that the busiest origin carried, the mean over every
   * request's start: what killing it would cut.
   */
  busiestShare: number;
  /** The least that share could be (the streams split as evenly as they go), the same mean. */
  evenShare: number;
  /** Streams in flight, the mean over every request's start. */
  inFlight: number;
  /** Requests each origin served, in order. */
  perOrigin: number[];
  /** Share of placements the other router would have made the same (two edges only). */
  agreement: number | null;
  /** The (first) router's placements by reason and its predicted hit rate (warmgate only). */
  placements: Record<string, number> | null;
  predictedHitRate: number | null;
  /** What killing the busiest origin cut (with `killAt` only). */
  kill?: KillResult;
}
