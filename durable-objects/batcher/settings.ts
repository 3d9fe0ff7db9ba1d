/**
 * The batching settings of a Batcher, with their defaults, in one place: the edge
 * validates `WARMGATE_CONFIG`'s `batching` with them and sends the result in each
 * Batcher's setup (docs/batching.md, "Settings").
 */
import { z } from "zod";
import { MAX_BATCH_ITEMS } from "../../contracts/protocol.ts";

/** One priority lane: how long its requests may wait and what happens after that. */
export const LaneConfigSchema = z.strictObject({
  /** Longest wait in the batcher before the lane's timeout policy applies. */
  queueTimeoutMs: z.int().positive().default(30_000),
  /** `reject` settles the request with a queue-timeout error; `wait` keeps it queued. */
  onTimeout: z.enum(["reject", "wait"]).default("reject"),
  /** Queued requests the lane holds; one more is refused at once with `retry-after`. */
  maxQueue: z.int().positive().default(1024),
  /** Status of a queue-timeout refusal: 503 (overloaded) or 429 (retry later, `retry-after`). */
  timeoutStatus: z.union([z.literal(429), z.literal(503)]).default(503),
});
/** A validated lane configuration. */
export type LaneConfig = z.infer<typeof LaneConfigSchema>;

/** Default lanes: interactive, standard, and background (which waits rather than fail). */
export const DEFAULT_LANES: readonly LaneConfig[] = [
  { queueTimeoutMs: 30_000, onTimeout: "reject", maxQueue: 1024, timeoutStatus: 503 },
  { queueTimeoutMs: 60_000, onTimeout: "reject", maxQueue: 2048, timeoutStatus: 503 },
  { queueTimeoutMs: 300_000, onTimeout: "wait", maxQueue: 4096, timeoutStatus: 503 },
];

/** Batching configuration of one Batcher. */
export const WindowConfigSchema = z
  .strictObject({
    /** Most requests in one upstream call (Triton's `max_batch_size`). */
    maxBatchSize: z.int().min(1).max(MAX_BATCH_ITEMS).default(32),
    /** Most prompt plus `max_tokens` in one call; a lone larger request still goes alone. */
    maxBatchTokens: z.int().positive().default(65_536),
    /** Upper bound of the adaptive window (Triton's `max_queue_delay_microseconds`). */
    maxWindowMs: z.number().nonnegative().max(1000).default(10),
    /**
     * Shortest useful gap between two calls to one origin, about one engine step (vLLM
     * admits new sequences only at step boundaries): while requests arrive faster than one
     * per this many ms per healthy origin, they share calls. An origin whose load reports
     * carry a longer step time (`step_ms`) is called at most once per step instead. 0
     * turns the call term off.
     */
    callIntervalMs: z.number().nonnegative().max(1000).default(5),
    /**
     * Share of the current wait for a first byte (see the top of this file) that the window
     * may add. 0 turns the wait term off.
     */
    waitShare: z.number().min(0).max(1).default(0.1),
    /**
     * Share of the thread's recent lag (see `recordThreadLag`) for which a streamed item's
     * later tokens may be held to leave in one write (see {@link tokenHoldMs}). 0: every
     * origin chunk's bytes leave at once.
     */
    holdShare: z.number().min(0).max(1).default(1),
    /** Upper bound of that hold, ms. */
    maxHoldMs: z.number().nonnegative().max(1000).default(10),
    /** Time constant of the decaying arrival, completion and dispatch counts. */
    rateWindowMs: z.number().positive().default(250),
    /** A load report older than this, with nothing of ours in flight there, is not trusted. */
    loadReportTtlMs: z.int().positive().default(1000),
    /** Priority lanes, highest first; lane 0 leaves before lane 1. */
    lanes: z
      .array(LaneConfigSchema)
      .min(1)
      .max(16)
      .default(() => DEFAULT_LANES.map((lane) => ({ ...lane }))),
    /** Origins of this region and model, in preference order for ties. */
    origins: z.array(z.strictObject({ id: z.string().min(1).max(128) })).min(1),
  })
  .refine((config) => new Set(config.origins.map((o) => o.id)).size === config.origins.length, {
    message: "origin ids must be unique",
    path: ["origins"],
  });
/** A validated batching configuration (defaults filled in). */
export type WindowConfig = z.infer<typeof WindowConfigSchema>;
/** Batching configuration as written, before defaults. */
export type WindowConfigInput = z.input<typeof WindowConfigSchema>;
