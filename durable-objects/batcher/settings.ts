/**
 * The Batcher's settings in one place (docs/batching.md, "Settings"; docs/routing.md,
 * "Settings"): the schemas of `WARMGATE_CONFIG`'s `batching` section (and each override)
 * and `routing` section, every default, and the window configuration and router settings
 * a Batcher runs with, derived from them.
 */
import { z } from "zod";
import { DEFAULT_QUARANTINE_MS } from "../../contracts/origin-health.ts";
import { MAX_BATCH_ITEMS } from "../../contracts/protocol/framing.ts";

/** One priority lane as written; every field optional. */
export const BatchingLaneSchema = z.strictObject({
  /** Longest wait in the batcher before `on_timeout` applies (default 30 s, 60 s, 5 min). */
  queue_timeout_ms: z.int().positive().optional(),
  /** `reject` answers `refuse_status` once the wait is over; `wait` keeps the request queued. */
  on_timeout: z.enum(["reject", "wait"]).optional(),
  /** Requests the lane holds; one more is refused at once with `refuse_status`. */
  max_queue: z.int().positive().optional(),
  /** Status of a refusal for overload (a full lane or a queue timeout): 503 (default) or 429. */
  refuse_status: z.union([z.literal(429), z.literal(503)]).optional(),
});

/** The batching fields as written; every one optional, defaults in {@link BATCHING_DEFAULTS}. */
export const BATCHING_FIELDS = {
  /** Send through the Batcher or straight to origins, one call per request. */
  enabled: z.boolean().optional(),
  /** Most requests in one upstream call. */
  max_batch_size: z.int().min(1).max(MAX_BATCH_ITEMS).optional(),
  /** Most prompt plus `max_tokens` in one call; a lone larger request still goes alone. */
  max_batch_tokens: z.int().positive().optional(),
  /** Upper bound of the adaptive window. */
  max_window_ms: z.number().nonnegative().max(1000).optional(),
  /**
   * Shortest useful gap between calls to one origin, about one engine step (0: no call
   * pacing); an origin that reports a longer engine step is called at most once per step.
   */
  call_interval_ms: z.number().nonnegative().max(1000).optional(),
  /**
   * Sequences an origin's engine may queue beyond its running slots, by its load reports,
   * before the Batcher holds new requests in its lanes instead of sending them.
   */
  max_origin_queue: z.int().min(1).max(4096).optional(),
  /** Time constant of the arrival, completion and dispatch rates. */
  rate_window_ms: z.number().positive().optional(),
  /** Age past which an origin's load report is not trusted while idle. */
  load_report_ttl_ms: z.int().positive().optional(),
  /** Priority lanes, highest first. */
  lanes: z.array(BatchingLaneSchema).min(1).max(16).optional(),
  /** Lane of a caller with no tier (clamped to the lanes there are). */
  default_lane: z.int().min(0).max(15).optional(),
  /** Batchers per region and model. */
  shards: z.int().min(1).max(256).optional(),
  /** What picks a request's shard: its request id or its API key. */
  shard_by: z.enum(["request", "key"]).optional(),
  /** How long an origin that failed is tried only after every healthy one. */
  origin_quarantine_ms: z.int().nonnegative().max(600_000).optional(),
  /** Share of the recent wait for a first byte the window may add (0: off). */
  wait_share: z.number().min(0).max(1).optional(),
  /** Share of the Batcher's thread lag for which a streamed answer's later tokens may wait. */
  hold_share: z.number().min(0).max(1).optional(),
  /** Longest such hold, ms. */
  max_hold_ms: z.number().nonnegative().max(1000).optional(),
  /** How long after its Batcher last sent at once an otherwise idle edge skips it (0: never). */
  idle_bypass_ms: z.int().nonnegative().max(60_000).optional(),
  /** Bytes of a streamed answer held for a slow client before it is dropped. */
  max_client_backlog_bytes: z
    .int()
    .positive()
    .max(64 * 1024 * 1024)
    .optional(),
};

/** The batching settings as written (global, or one override's). */
export type BatchingSettings = z.infer<z.ZodObject<typeof BATCHING_FIELDS>>;

/** One priority lane, defaults filled in. */
export interface LaneConfig {
  queueTimeoutMs: number;
  onTimeout: "reject" | "wait";
  maxQueue: number;
  refuseStatus: 429 | 503;
}

/** What a lane given without some field has for it. */
const LANE_DEFAULTS: LaneConfig = {
  queueTimeoutMs: 30_000,
  onTimeout: "reject",
  maxQueue: 1024,
  refuseStatus: 503,
};

/** Default lanes: interactive, standard, and background (which waits rather than fail). */
export const DEFAULT_LANES: readonly LaneConfig[] = [
  LANE_DEFAULTS,
  { ...LANE_DEFAULTS, queueTimeoutMs: 60_000, maxQueue: 2048 },
  { ...LANE_DEFAULTS, queueTimeoutMs: 300_000, onTimeout: "wait", maxQueue: 4096 },
];

/** Every batching default. */
export const BATCHING_DEFAULTS = {
  enabled: true,
  max_batch_size: 32,
  max_batch_tokens: 65_536,
  max_window_ms: 10,
  call_interval_ms: 5,
  max_origin_queue: 8,
  rate_window_ms: 250,
  load_report_ttl_ms: 1000,
  default_lane: 1,
  shards: 1,
  shard_by: "request",
  origin_quarantine_ms: DEFAULT_QUARANTINE_MS,
  wait_share: 0.1,
  hold_share: 1,
  max_hold_ms: 10,
  idle_bypass_ms: 1000,
  max_client_backlog_bytes: 512 * 1024,
} as const satisfies Required<Omit<BatchingSettings, "lanes">>;

/** What a Batcher's window policy runs with (docs/batching.md, "The window"). */
export interface WindowConfig {
  maxBatchSize: number;
  maxBatchTokens: number;
  maxWindowMs: number;
  callIntervalMs: number;
  /** Sequences an origin may queue beyond its slots before requests wait in the lanes. */
  maxOriginQueue: number;
  /** Share of the current wait for a first byte that the window may add. */
  waitShare: number;
  /** Share of the thread's recent lag for which later tokens may be held. */
  holdShare: number;
  maxHoldMs: number;
  rateWindowMs: number;
  loadReportTtlMs: number;
  /** Highest first; lane 0 leaves before lane 1. */
  lanes: LaneConfig[];
  /** Origins of this region and model, in preference order for ties. */
  origins: { id: string }[];
}

/** The window configuration for `settings` (defaults filled in) over these origins. */
export function windowConfigOf(
  settings: BatchingSettings,
  originIds: readonly string[],
): WindowConfig {
  const d = BATCHING_DEFAULTS;
  return {
    maxBatchSize: settings.max_batch_size ?? d.max_batch_size,
    maxBatchTokens: settings.max_batch_tokens ?? d.max_batch_tokens,
    maxWindowMs: settings.max_window_ms ?? d.max_window_ms,
    callIntervalMs: settings.call_interval_ms ?? d.call_interval_ms,
    maxOriginQueue: settings.max_origin_queue ?? d.max_origin_queue,
    waitShare: settings.wait_share ?? d.wait_share,
    holdShare: settings.hold_share ?? d.hold_share,
    maxHoldMs: settings.max_hold_ms ?? d.max_hold_ms,
    rateWindowMs: settings.rate_window_ms ?? d.rate_window_ms,
    loadReportTtlMs: settings.load_report_ttl_ms ?? d.load_report_ttl_ms,
    lanes:
      settings.lanes?.map((lane) => ({
        queueTimeoutMs: lane.queue_timeout_ms ?? LANE_DEFAULTS.queueTimeoutMs,
        onTimeout: lane.on_timeout ?? LANE_DEFAULTS.onTimeout,
        maxQueue: lane.max_queue ?? LANE_DEFAULTS.maxQueue,
        refuseStatus: lane.refuse_status ?? LANE_DEFAULTS.refuseStatus,
      })) ?? DEFAULT_LANES.map((lane) => ({ ...lane })),
    origins: originIds.map((id) => ({ id })),
  };
}

/** Most origins a region may have where routing is on (the index keeps one bit each). */
export const MAX_ROUTED_ORIGINS = 32;

/** Leading prefix blocks (64 tokens) whose hash keys a cold prefix and a request's shard. */
export const COLD_KEY_BLOCKS = 4;

/** The `routing` section as written; every field optional. */
export const RoutingConfigSchema = z.strictObject({
  /** Route each request to the origin whose prefix cache is warm for it (default true). */
  enabled: z.boolean().optional(),
  /** Fewest leading blocks (16 tokens each) that make an origin's match worth keeping. */
  min_match_blocks: z.int().min(1).max(1024).optional(),
  /**
   * A warm origin keeps its prefixes until its predicted time to first token exceeds the
   * best origin's by this share plus `spread_ms`; past it the prefix spreads.
   */
  spread_ratio: z.number().min(0).max(100).optional(),
  spread_ms: z.number().min(0).max(60_000).optional(),
  /** A cold prefix's consistent-hash origin is skipped above this multiple of the mean load. */
  load_bound: z.number().min(1).max(10).optional(),
  /** Prefill speed assumed for an origin that reports none (prompt tokens per second). */
  prefill_tokens_per_s: z.number().positive().optional(),
  /** Most prefix blocks remembered per origin (a bound on memory). */
  max_index_blocks: z.int().min(16).max(1_048_576).optional(),
});

/** The `routing` section as written. */
export type RoutingConfig = z.infer<typeof RoutingConfigSchema>;

/** What a router runs with, every default filled in. */
export interface RouterSettings {
  minMatchBlocks: number;
  spreadRatio: number;
  spreadMs: number;
  loadBound: number;
  prefillTokensPerMs: number;
  maxIndexBlocks: number;
}

/** The defaults of {@link RouterSettings}. */
export const ROUTER_DEFAULTS: Readonly<RouterSettings> = {
  minMatchBlocks: 4,
  spreadRatio: 1,
  spreadMs: 100,
  loadBound: 1.25,
  prefillTokensPerMs: 10,
  maxIndexBlocks: 65_536,
};

/** Whether routing applies: on unless the section turns it off. */
export function routingEnabled(config: RoutingConfig | undefined): boolean {
  return config?.enabled ?? true;
}

/** The router settings of a `routing` section. */
export function routerSettingsOf(config: RoutingConfig | undefined): RouterSettings {
  const d = ROUTER_DEFAULTS;
  return {
    minMatchBlocks: config?.min_match_blocks ?? d.minMatchBlocks,
    spreadRatio: config?.spread_ratio ?? d.spreadRatio,
    spreadMs: config?.spread_ms ?? d.spreadMs,
    loadBound: config?.load_bound ?? d.loadBound,
    prefillTokensPerMs:
      config?.prefill_tokens_per_s === undefined
        ? d.prefillTokensPerMs
        : config.prefill_tokens_per_s / 1000,
    maxIndexBlocks: config?.max_index_blocks ?? d.maxIndexBlocks,
  };
}
