/**
 * The `batching` section of `WARMGATE_CONFIG` (docs/configuration.md, "Batching"; the
 * settings' meaning: docs/batching.md): every field with its default, the overrides for a
 * region, a model or both, and the settings one region's Batchers for one model run with.
 */
import { z } from "zod";
import { DEFAULT_QUARANTINE_MS } from "../origin-health.ts";
import { MAX_BATCH_ITEMS } from "../protocol/framing.ts";
import { ConfigIdSchema } from "./models.ts";

/** One priority lane; a field left out takes the lane default. */
export const LaneSchema = z.strictObject({
  /** Longest wait in the batcher before `on_timeout` applies. */
  queue_timeout_ms: z.int().positive().default(30_000),
  /** `reject` answers `refuse_status` once the wait is over; `wait` keeps the request queued. */
  on_timeout: z.enum(["reject", "wait"]).default("reject"),
  /** Requests the lane holds; one more is refused at once with `refuse_status`. */
  max_queue: z.int().positive().default(1024),
  /** Status of a refusal for overload (a full lane or a queue timeout). */
  refuse_status: z.union([z.literal(429), z.literal(503)]).default(503),
});

/** Every batching field with its default; an override may set each of them. */
const BATCHING_FIELDS = {
  /** Send through the Batcher or straight to origins, one call per request. */
  enabled: z.boolean().default(true),
  /** Most requests in one upstream call. */
  max_batch_size: z.int().min(1).max(MAX_BATCH_ITEMS).default(32),
  /** Most prompt plus `max_tokens` in one call; a lone larger request still goes alone. */
  max_batch_tokens: z.int().positive().default(65_536),
  /** Upper bound of the adaptive window. */
  max_window_ms: z.number().nonnegative().max(1000).default(10),
  /**
   * Shortest useful gap between calls to one origin, about one engine step (0: no call
   * pacing); an origin that reports a longer engine step is called at most once per step.
   */
  call_interval_ms: z.number().nonnegative().max(1000).default(5),
  /**
   * Sequences an origin's engine may queue beyond its running slots, by its load reports,
   * before the Batcher holds new requests in its lanes instead of sending them.
   */
  max_origin_queue: z.int().min(1).max(4096).default(8),
  /** Time constant of the arrival, completion and dispatch rates. */
  rate_window_ms: z.number().positive().default(250),
  /** Age past which an origin's load report is not trusted while idle. */
  load_report_ttl_ms: z.int().positive().default(1000),
  /** Priority lanes, highest first: interactive, standard, and background (which waits). */
  lanes: z
    .array(LaneSchema)
    .min(1)
    .max(16)
    .prefault([
      {},
      { queue_timeout_ms: 60_000, max_queue: 2048 },
      { queue_timeout_ms: 300_000, on_timeout: "wait", max_queue: 4096 },
    ]),
  /** Lane of a caller with no tier (clamped to the lanes there are). */
  default_lane: z.int().min(0).max(15).default(1),
  /** Batchers per region and model. */
  shards: z.int().min(1).max(256).default(1),
  /** What picks a request's shard: its request id or its API key. */
  shard_by: z.enum(["request", "key"]).default("request"),
  /** Most Batchers per region and model when they split under load (at most `shards`: fixed). */
  max_shards: z.int().min(1).max(256).default(1),
  /** Thread lag (ms) past which a Batcher that keeps lagging splits (docs/batching.md, "Shards"). */
  split_lag_ms: z.number().positive().max(10_000).default(20),
  /**
   * Thread lag (ms) past which the batch lane sends no line while interactive requests run
   * or wait: the Batcher's thread, like the origins' slots, is theirs first
   * (docs/batch-api.md, "Interactive first").
   */
  batch_max_lag_ms: z.number().positive().max(10_000).default(20),
  /** How long an origin that failed is tried only after every healthy one. */
  origin_quarantine_ms: z.int().nonnegative().max(600_000).default(DEFAULT_QUARANTINE_MS),
  /** Share of the recent wait for a first byte the window may add (0: off). */
  wait_share: z.number().min(0).max(1).default(0.1),
  /** Share of the Batcher's thread lag for which a streamed answer's later tokens may wait. */
  hold_share: z.number().min(0).max(1).default(1),
  /** Longest such hold, ms. */
  max_hold_ms: z.number().nonnegative().max(1000).default(10),
  /**
   * Items the Batcher must run at once before any token is held: below it every origin
   * chunk's tokens leave at once (docs/batching.md, "Token holds").
   */
  hold_min_in_flight: z.int().nonnegative().max(100_000).default(128),
  /**
   * How long after its Batcher last sent at once an otherwise idle edge skips it (0: never;
   * docs/batching.md, "Settings").
   */
  idle_bypass_ms: z.int().nonnegative().max(60_000).default(3000),
  /** Bytes of a streamed answer held for a slow client before it is dropped. */
  max_client_backlog_bytes: z
    .int()
    .positive()
    .max(64 * 1024 * 1024)
    .default(512 * 1024),
};

/** The batching settings of one region and model, every default applied. */
export const BatchingSettingsSchema = z.strictObject(BATCHING_FIELDS).transform((b) => ({
  enabled: b.enabled,
  /** What the Batcher's window policy runs with (docs/batching.md, "The window"). */
  window: {
    maxBatchSize: b.max_batch_size,
    maxBatchTokens: b.max_batch_tokens,
    maxWindowMs: b.max_window_ms,
    callIntervalMs: b.call_interval_ms,
    maxOriginQueue: b.max_origin_queue,
    waitShare: b.wait_share,
    holdShare: b.hold_share,
    maxHoldMs: b.max_hold_ms,
    holdMinInFlight: b.hold_min_in_flight,
    rateWindowMs: b.rate_window_ms,
    loadReportTtlMs: b.load_report_ttl_ms,
    batchMaxLagMs: b.batch_max_lag_ms,
    /** Highest first; lane 0 leaves before lane 1. */
    lanes: b.lanes.map((lane) => ({
      queueTimeoutMs: lane.queue_timeout_ms,
      onTimeout: lane.on_timeout,
      maxQueue: lane.max_queue,
      refuseStatus: lane.refuse_status,
    })),
  },
  shards: b.shards,
  shardBy: b.shard_by,
  scaling: {
    minShards: b.shards,
    maxShards: Math.max(b.shards, b.max_shards),
    splitLagMs: b.split_lag_ms,
  },
  defaultLane: Math.min(b.default_lane, b.lanes.length - 1),
  idleBypassMs: b.idle_bypass_ms,
  quarantineMs: b.origin_quarantine_ms,
  clientBacklogBytes: b.max_client_backlog_bytes,
}));

/** Batching settings of one region and model. */
export type BatchingSettings = z.output<typeof BatchingSettingsSchema>;
/** What a Batcher's window policy runs with: the settings and the origins it chooses among. */
export type WindowConfig = BatchingSettings["window"] & {
  /** Origins of this region and model, in preference order for ties. */
  origins: { id: string }[];
  /**
   * Index of the batch lane, the last of `lanes` and below every interactive one: its
   * requests take only running slots the origins report free (docs/batch-api.md). Absent:
   * no batch lane.
   */
  batchLane?: number;
};

/**
 * The batch lane's queue: its lines wait as long as their 24-hour window allows, and a
 * batch keeps only a bounded number of its lines in it.
 */
export const BATCH_LANE: LaneConfig = {
  queueTimeoutMs: 86_400_000,
  onTimeout: "wait",
  maxQueue: 65_536,
  refuseStatus: 503,
};
/** One priority lane, as the window runs it. */
export type LaneConfig = WindowConfig["lanes"][number];

type Unset<T extends Record<string, z.ZodDefault | z.ZodPrefault>> = {
  [K in keyof T]: z.ZodOptional<ReturnType<T[K]["unwrap"]>>;
};

// As written: an unset field stays unset, so that an override sets only what it names.
function unset<T extends Record<string, z.ZodDefault | z.ZodPrefault>>(fields: T): Unset<T> {
  const entries = Object.entries(fields).map(([name, field]) => [
    name,
    (field.unwrap() as z.ZodType).optional(),
  ]);
  return Object.fromEntries(entries) as Unset<T>;
}

const WRITTEN_FIELDS = unset(BATCHING_FIELDS);

/** The `batching` section as written: global fields, then overrides (later ones win). */
export const BatchingSectionSchema = z.strictObject({
  ...WRITTEN_FIELDS,
  overrides: z
    .array(
      z.strictObject({
        region: ConfigIdSchema.optional(),
        model: ConfigIdSchema.optional(),
        ...WRITTEN_FIELDS,
      }),
    )
    .default([]),
});

/** The `batching` section as validated, before the defaults. */
export type BatchingSection = z.output<typeof BatchingSectionSchema>;

/** The settings of a region and model: the global fields, then each matching override. */
export function batchingSettings(
  section: BatchingSection,
  region: string,
  model: string,
): BatchingSettings {
  const { overrides, ...written } = section;
  let merged: Record<string, unknown> = written;
  for (const { region: r, model: m, ...override } of overrides) {
    if ((r === undefined || r === region) && (m === undefined || m === model)) {
      merged = { ...merged, ...definedOnly(override) };
    }
  }
  // Validated already: this parse only applies the defaults.
  return BatchingSettingsSchema.parse(merged);
}

function definedOnly(value: object): Record<string, unknown> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined));
}
