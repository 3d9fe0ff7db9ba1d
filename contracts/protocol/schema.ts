/**
 * The batch protocol's wire shapes (origin/PROTOCOL.md) as zod schemas: each is the
 * validator and, through `z.output`, the type. The origin checks what the edge sends with
 * them; the edge and the Batcher check what an origin answers (framing.ts). Runtime-neutral.
 */
import { z } from "zod";

/** Protocol version, sent as `warmgate-batch-version` and in the request envelope. */
export const BATCH_PROTOCOL_VERSION = 1;
/** Path of the batch endpoint on an origin. */
export const BATCH_PATH = "/v1/batch";
/** Path of the cancel endpoint on an origin. */
export const BATCH_CANCEL_PATH = "/v1/batch/cancel";
/** Path where an origin tells how the items of given requests ended (see PROTOCOL.md). */
export const OUTCOMES_PATH = "/v1/batch/outcomes";
/** Most request ids one outcomes lookup may name. */
export const MAX_OUTCOME_IDS = 1_000;
/** Most request-id prefixes one outcomes lookup may name. */
export const MAX_OUTCOME_PREFIXES = 100;
/** Shortest request-id prefix an outcomes lookup may name (`req_` and 16 more characters). */
export const MIN_OUTCOME_PREFIX_CHARS = 20;
/** Longest batch id, item id or request id, in characters. */
export const MAX_ID_CHARS = 256;
/** Longest identity of an origin's block-event log in a cursor, in characters. */
export const MAX_KV_LOG_CHARS = 64;

/** The engine paths an item may target. */
export const ITEM_PATHS = [
  "/v1/chat/completions",
  "/v1/completions",
  "/v1/responses",
  "/v1/embeddings",
] as const;
/** An engine path an item may target. */
export type ItemPath = (typeof ITEM_PATHS)[number];

/** One request inside a batch. */
export const BatchItemSchema = z.object({
  /** Unique id of the request (the edge's `x-request-id`). */
  id: z.string().min(1).max(MAX_ID_CHARS),
  /** OpenAI-compatible path the item is for. */
  path: z.enum(ITEM_PATHS),
  /** Request headers worth forwarding to the engine (lower-case names). */
  headers: z.record(z.string(), z.string()).optional(),
  /** The client's request body, as raw JSON text, so unknown fields travel untouched. */
  body: z.string(),
  /** Give up on the item after this many milliseconds (outcome `timeout`). */
  timeout_ms: z.int().positive().optional(),
  /** Higher runs first when the engine has to queue. */
  priority: z.number().optional(),
  /**
   * Work that can wait (a Batch API line): the origin starts it only into slots that
   * interactive items leave, may stop and restart it for them, and keeps its answer.
   */
  background: z.boolean().optional(),
});
/** One request inside a batch. */
export type BatchItem = z.output<typeof BatchItemSchema>;

/** A place in an origin's log of block events. */
export const KvEventCursorSchema = z.object({
  /** The log's identity; a new one (the origin restarted) starts from nothing. */
  log: z.string().max(MAX_KV_LOG_CHARS),
  /** The last event seen (0: none). */
  seq: z.int().nonnegative(),
});
/** A place in an origin's log of block events. */
export type KvEventCursor = z.output<typeof KvEventCursorSchema>;

/** Body of `POST /v1/batch`. */
export const BatchRequestSchema = z.object({
  v: z.literal(BATCH_PROTOCOL_VERSION),
  /** Unique id of the batch, used by the cancel endpoint. */
  batch_id: z.string().min(1).max(MAX_ID_CHARS),
  items: z.array(BatchItemSchema).min(1),
  /**
   * The block events this caller has seen from the origin's log: the call's LOAD frames
   * bring the ones after it (see {@link KvEventsSchema}). Absent: send none.
   */
  kv_events_after: KvEventCursorSchema.optional(),
  /**
   * A batch of one item whose body follows its HEAD unframed (origin/PROTOCOL.md, "Raw
   * answers"): the caller pipes it to its client as it is, and reads how the item ended from
   * the outcomes endpoint.
   */
  raw: z.literal(true).optional(),
});
/** Body of `POST /v1/batch`. */
export type BatchRequest = z.output<typeof BatchRequestSchema>;

/** Body of `POST /v1/batch/cancel`: a batch, items, or both (at least one). */
export const CancelRequestSchema = z
  .object({
    /** The batch; absent, each item is found in whichever batch runs it. */
    batch_id: z.string().min(1).optional(),
    /** Item ids to cancel; absent means every unfinished item of the batch. */
    ids: z.array(z.string()).optional(),
  })
  .refine((request) => request.batch_id !== undefined || request.ids !== undefined, {
    message: "A cancel names a batch_id, ids, or both.",
    path: ["batch_id"],
  });
/** Body of `POST /v1/batch/cancel`. */
export type CancelRequest = z.output<typeof CancelRequestSchema>;

/**
 * Body of `POST /v1/batch/outcomes`: request ids (an item id up to its first `.`), and
 * request-id prefixes, each standing for every request whose id starts with it.
 */
export const OutcomesRequestSchema = z.object({
  ids: z.array(z.string().min(1).max(MAX_ID_CHARS)).max(MAX_OUTCOME_IDS),
  prefixes: z
    .array(z.string().min(MIN_OUTCOME_PREFIX_CHARS).max(MAX_ID_CHARS))
    .max(MAX_OUTCOME_PREFIXES)
    .optional(),
});
/** Body of `POST /v1/batch/outcomes`. */
export type OutcomesRequest = z.output<typeof OutcomesRequestSchema>;

/** Payload of a HEAD frame: the engine's status and headers for the item. */
export const ItemHeadSchema = z.object({
  id: z.string(),
  // A final HTTP status: what a `Response` can carry (1xx are never final).
  status: z.int().min(200).max(599),
  headers: z.record(z.string(), z.string()),
});
/** Payload of a HEAD frame. */
export type ItemHead = z.output<typeof ItemHeadSchema>;

/** Token usage of one item, as the engine reported it. */
export const ItemUsageSchema = z.object({
  prompt_tokens: z.number(),
  completion_tokens: z.number(),
  total_tokens: z.number(),
  /** Prompt tokens served from the prefix cache. */
  cached_tokens: z.number(),
});
/** Token usage of one item, as the engine reported it. */
export type ItemUsage = z.output<typeof ItemUsageSchema>;

/** How an item ended. */
export const ItemOutcomeSchema = z.enum(["ok", "error", "cancelled", "timeout"]);
/** How an item ended. */
export type ItemOutcome = z.output<typeof ItemOutcomeSchema>;

/** Milliseconds: queued before the engine started an item, to its first body byte, in all. */
export const ItemTimingSchema = z.object({
  queued_ms: z.number(),
  ttft_ms: z.number().nullable(),
  total_ms: z.number(),
});

/** An item's timing. */
export type ItemTiming = z.output<typeof ItemTimingSchema>;

/** Payload of an END frame: how the item ended, and what it generated. */
export const ItemTrailerSchema = z.object({
  id: z.string(),
  outcome: ItemOutcomeSchema,
  /** Usage when the engine reported it (also for errors after tokens were produced). */
  usage: ItemUsageSchema.nullable(),
  /** Why the item failed; present when outcome is not `ok`. */
  error: z
    .object({ message: z.string(), type: z.string(), code: z.string().nullable() })
    .optional(),
  timing: ItemTimingSchema.optional(),
});
/** Payload of an END frame. */
export type ItemTrailer = z.output<typeof ItemTrailerSchema>;

/** One item of a looked-up request, as its origin last saw it. */
export const ItemRecordSchema = z.discriminatedUnion("state", [
  z.object({ id: z.string(), state: z.literal("running") }),
  z.object({
    id: z.string(),
    state: z.literal("ended"),
    outcome: ItemOutcomeSchema,
    usage: ItemUsageSchema.nullable(),
    /** Its END's timing, when the origin keeps it. */
    timing: ItemTimingSchema.optional(),
  }),
]);
/** One item of a looked-up request, as its origin last saw it. */
export type ItemRecord = z.output<typeof ItemRecordSchema>;

/**
 * Answer of `POST /v1/batch/outcomes`: every item the origin remembers for those ids and
 * of the requests whose id starts with one of those prefixes.
 */
export const OutcomesResponseSchema = z.object({ items: z.array(ItemRecordSchema) });
/** Answer of `POST /v1/batch/outcomes`. */
export type OutcomesResponse = z.output<typeof OutcomesResponseSchema>;

/**
 * What the origin's engine stored in and dropped from its prefix cache since a cursor, as
 * the edge's block hashes (contracts/prefix-blocks.ts) of the prompts it served.
 */
export const KvEventsSchema = KvEventCursorSchema.extend({
  stored: z.array(z.number()),
  removed: z.array(z.number()),
  /**
   * The engine's whole state follows (a caller of another log, or further behind than the
   * log keeps): forget what was known before `stored`.
   */
  cleared: z.boolean(),
});
/** Block events since a cursor. */
export type KvEvents = z.output<typeof KvEventsSchema>;

/** Payload of a LOAD frame: the origin's state when it was written. */
export const LoadReportSchema = z.object({
  /** Origin's identity (its `--origin-id`). */
  origin: z.string(),
  /** Milliseconds since the epoch. */
  t: z.number(),
  /** Sequences being generated. */
  running: z.number(),
  /** Sequences waiting for a slot or for KV memory. */
  waiting: z.number(),
  /** Fraction of KV blocks in use, 0..1. */
  kv_usage: z.number(),
  /** KV blocks free or evictable. */
  kv_free_blocks: z.number(),
  /** KV blocks in all. */
  kv_total_blocks: z.number(),
  /** Tokens per KV block. */
  block_size: z.number(),
  /** Prompt tokens looked up in the prefix cache since start. */
  prefix_queries: z.number(),
  /** Of those, tokens found. */
  prefix_hits: z.number(),
  /** Most sequences the engine runs at once. */
  max_num_seqs: z.number(),
  /**
   * Recent mean duration of one engine step in ms, about the time between two tokens of a
   * running sequence (vLLM's inter-token latency); the engine starts new sequences only at
   * step boundaries. Absent or 0 when unknown.
   */
  step_ms: z.number().optional(),
  /** Prompt tokens per second the engine prefills, when it knows. */
  prefill_tokens_per_s: z.number().optional(),
  /** Prompt tokens the engine still has to prefill (queued and in progress), when it knows. */
  prefill_backlog_tokens: z.number().optional(),
  /** Block events since the call's `kv_events_after`, where the engine reports them. */
  kv_events: KvEventsSchema.optional(),
  /**
   * Background items (see `BatchItem.background`) among `running`, and those the origin
   * holds outside the engine until a slot is free; absent: none.
   */
  background_running: z.number().optional(),
  background_queued: z.number().optional(),
  /**
   * Most background items the origin runs at once (its slots less the reserve it keeps for
   * interactive items); absent: it takes one only while idle.
   */
  background_cap: z.number().optional(),
});
/** Payload of a LOAD frame. */
export type LoadReport = z.output<typeof LoadReportSchema>;

/** A load report's counts when nothing runs and the engine reports no metrics. */
export const IDLE_LOAD: Omit<LoadReport, "origin" | "t"> = {
  running: 0,
  waiting: 0,
  kv_usage: 0,
  kv_free_blocks: 0,
  kv_total_blocks: 0,
  block_size: 0,
  prefix_queries: 0,
  prefix_hits: 0,
  max_num_seqs: 0,
};

/** The item id of a request's `n`th attempt: the request id, then `.n` for every retry. */
export function attemptId(requestId: string, n: number): string {
  return n === 0 ? requestId : `${requestId}.${n}`;
}

/** The request an item id belongs to: a retry's attempt id is the request id, `.`, a number. */
export function requestIdOf(itemId: string): string {
  const dot = itemId.indexOf(".");
  return dot < 0 ? itemId : itemId.slice(0, dot);
}

/** An item's attempt number: 0 for the request's first, `n` for its id's `.n`. */
export function attemptOf(itemId: string): number {
  const dot = itemId.indexOf(".");
  return dot < 0 ? 0 : Number(itemId.slice(dot + 1)) || 0;
}
