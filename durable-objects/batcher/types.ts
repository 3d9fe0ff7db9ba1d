/**
 * The contract of a `Batcher` (docs/batching.md): what a request attempt sends (with the
 * setup of `contracts/config/plans.ts`), what `open`, `end`, `answer`, `cancel` and
 * `snapshot` answer, and its constants.
 */
import type { HistogramData } from "../../contracts/prometheus.ts";
import { z } from "zod";
import type { ErrorCode } from "../../contracts/errors.ts";
import { parsePayload } from "../../contracts/protocol/framing.ts";
import {
  type ItemHead,
  type ItemPath,
  ItemTrailerSchema,
} from "../../contracts/protocol/schema.ts";
import type { BatcherSetup, ShardScaling } from "../../contracts/config/plans.ts";
import type { ShardCount } from "../batcher-shards/types.ts";
import type { RouterView } from "./routing/router.ts";
import type { FlushReason, OriginLoadView } from "./window/types.ts";

/** One request attempt handed to `open` or `answer`. */
export interface BatcherAttempt {
  /**
   * The settings the Batcher runs with, which its name's version fixes: sent until it holds
   * them; one that holds none answers {@link BatcherSetupNeeded}.
   */
  setup?: BatcherSetup;
  /** Item id on the wire; unique per attempt (a retry in the same region gets a new one). */
  id: string;
  path: ItemPath;
  /** The client's body text, forwarded untouched. */
  body: string;
  /** Lower-case headers passed to the engine. */
  headers: Record<string, string>;
  /** Priority lane, 0 highest. */
  lane: number;
  promptTokens: number;
  maxTokens: number;
  /** Absolute ms after which the caller no longer wants an answer. */
  deadline: number;
  /**
   * Once sent, give up when the origin has not answered within this many ms; for a streamed
   * item (`open`) that covers its HEAD too.
   */
  firstByteTimeoutMs: number;
  /** The origin gives up on the item after this many ms. */
  itemTimeoutMs: number;
  /** Origins that already failed this request. */
  avoidOrigins: string[];
  /**
   * How long the caller's recent requests here waited for their first byte, as it saw it
   * (ms; null when it has no figure yet): the window's wait term takes it into account.
   */
  recentFirstByteMs?: number | null;
  /** Its prefix, where routing is on (see {@link AttemptRoute}). */
  route?: AttemptRoute;
  /** The shard it was sent to, where its Batchers may split (see {@link AttemptShard}). */
  shard?: AttemptShard;
}

/** Which shard of its region and model's Batchers an attempt was sent to. */
export interface AttemptShard {
  /** The name of the region and model's `BatcherShards`, to which this shard reports. */
  group: string;
  index: number;
  scaling: ShardScaling;
}

/** The shard count the Batcher last heard, which its answers carry for the edge. */
export interface ShardCountNote {
  shards?: ShardCount;
}

/** What the router needs of a request beyond its size. */
export interface AttemptRoute {
  /** Chain hashes of its prompt's prefix blocks (contracts/prefix-blocks.ts). */
  blocks: number[];
  /** Its session: the OpenAI `user` field or the `x-warmgate-session` header. */
  session: string | null;
  /** An origin it asks for (`x-warmgate-origin`, where its key allows it). */
  pinned: string | null;
}

/** The HEAD payload a caller receives: the origin's, plus which origin it is. */
export interface BatcherHead extends ItemHead {
  /** The configured id of the origin serving the item. */
  origin: string;
}

/** Why an item ended before its origin answered (`error.code` of its lone END). */
export const BatcherFailureCodeSchema = z.enum([
  /** Waited past its lane's timeout or its deadline; the trailer carries `status`. */
  "queue_timeout",
  /** No origin of this batcher may take it (all down, or all avoided). */
  "no_healthy_origin",
  /** The origin could not be reached or said it cannot take work. */
  "origin_unavailable",
  /** The origin answered the call with something other than a framed batch, or broke. */
  "origin_error",
  /** The origin did not answer within the first-byte timeout. */
  "origin_timeout",
  /** No origin's KV cache can ever hold the prompt. */
  "prompt_too_large",
] as const satisfies readonly ErrorCode[]);
/** Why an item ended before its origin answered. */
export type BatcherFailureCode = z.output<typeof BatcherFailureCodeSchema>;

/** The trailer of an item's lone END when it ended before its origin answered. */
export const BatcherFailureTrailerSchema = ItemTrailerSchema.extend({
  outcome: z.enum(["error", "timeout"]),
  error: z.object({ message: z.string(), type: z.string(), code: BatcherFailureCodeSchema }),
  /** The origin that failed it, when one did. */
  origin: z.string().optional(),
  /** The call could not reach that origin at all (its connection failed, not given up on). */
  unreachable: z.literal(true).optional(),
  /**
   * Its origin refused the whole call for overload (429, or 503 with `retry-after`: busy,
   * not sick); `status` and `retry_after_ms` say how, and it ran nothing.
   */
  busy: z.literal(true).optional(),
  /** For `queue_timeout` and `busy`: the status to answer (429 or 503) and when to retry. */
  status: z.literal([429, 503]).optional(),
  retry_after_ms: z.number().optional(),
});
/** The trailer of an item's lone END when it ended before its origin answered. */
export type BatcherFailureTrailer = z.output<typeof BatcherFailureTrailerSchema>;

/** Item `id`'s lone END read from its trailer's bytes; bytes of another shape: an origin error. */
export function failureTrailerOf(id: string, bytes: Uint8Array): BatcherFailureTrailer {
  return (
    parsePayload(BatcherFailureTrailerSchema, bytes) ?? {
      id,
      outcome: "error",
      usage: null,
      error: { message: "malformed END trailer", type: "server_error", code: "origin_error" },
    }
  );
}

/** A request the batcher did not admit. */
export type BatcherNotAdmitted =
  /** The lane is full: answer the lane's `status` with `retry-after`. */
  | { kind: "refused"; reason: "queue_full"; status: 429 | 503; retryAfterMs: number }
  /** Refused before queueing, for a reason another region may not share. */
  | { kind: "failed"; code: BatcherFailureCode | "duplicate_id"; detail: string };

/** The Batcher holds no settings (a new incarnation): the call is made again with them. */
export interface BatcherSetupNeeded {
  kind: "setup_needed";
}

/** The answer to `answer`. */
export type BatcherAnswerResult =
  /**
   * The item ended (or closed without an END: cancelled, cut, or lost): its HEAD (null when
   * none came), body and END trailer (null without one), and how many ms after admission the
   * HEAD came. `atOnce`: it was sent at once, alone, with no window.
   */
  | ({
      kind: "answered";
      head: BatcherHead | null;
      headMs: number | null;
      body: Uint8Array;
      trailer: Uint8Array | null;
      atOnce: boolean;
    } & ShardCountNote)
  | BatcherSetupNeeded
  | BatcherNotAdmitted;

/** What `end` answers: the item's END as the origin sent it, and when its first byte left. */
export interface BatcherEnd {
  /** The trailer's JSON bytes; null when the item was cut, cancelled or unknown. */
  trailer: Uint8Array | null;
  /** When its first body byte left for the client (epoch ms); null when none did. */
  firstByteAt: number | null;
}

/** The answer to `open`. */
export type BatcherOpenResult =
  /**
   * Opened: the origin's HEAD, and the item's body on a stream of its own, which the caller
   * hands its client as it is. `atOnce` as for `answer`.
   */
  | ({
      kind: "open";
      head: BatcherHead;
      body: ReadableStream<Uint8Array>;
      atOnce: boolean;
    } & ShardCountNote)
  /** Ended before its origin answered: the lone END's trailer says why. */
  | ({ kind: "ended"; trailer: BatcherFailureTrailer; atOnce: boolean } & ShardCountNote)
  /** Its caller cancelled it before its HEAD. */
  | { kind: "cancelled" }
  | BatcherSetupNeeded
  | BatcherNotAdmitted;

/** How `cancel` treats a running item. */
export interface BatcherCancelOptions {
  /**
   * Cancel it on its origin but keep its stream open up to its END, whose usage counts
   * what was generated before the cancel (for billing a client that went away).
   */
  untilEnd?: boolean;
  /**
   * The caller's request timed out: a running item's body (see `open`) ends with a timeout
   * error event, and the item is cancelled (outright, or up to its END with `untilEnd`). An
   * item still waiting in its lane is left there: the lane's own timeout and policy decide.
   */
  timedOut?: boolean;
}

/** Counters since this incarnation started. */
export interface BatcherCounters {
  submitted: number;
  /** Sent at once, alone, with no window (the low-load path). */
  dispatchedAtOnce: number;
  /** Placed in a lane to wait for a flush. */
  queued: number;
  refusedQueueFull: number;
  /** Refused or failed before queueing for another reason. */
  refusedOther: number;
  queueTimeouts: number;
  /** Queued, then refused: every origin it may go to went behind its breaker. */
  queuedNoOrigin: number;
  cancelledWaiting: number;
  cancelledRunning: number;
  /** Items that failed after leaving the queue, before their origin's HEAD. */
  failedBeforeHead: number;
  /** Upstream calls by why they left, and the items they carried. */
  batches: Record<FlushReason, number>;
  batchItems: number;
  /** Upstream calls by items carried, in power-of-two buckets (`1`, `2`, `3-4`, `5-8`, …). */
  batchSizes: Record<string, number>;
  /** Waits from admission to the call leaving, ms, per bucket of `QUEUE_WAIT_BOUNDS_MS`. */
  queueWaitMs: HistogramData;
  /** Orphaned calls of earlier incarnations cancelled on their origins. */
  orphansCancelled: number;
  /** Times a call's reading gave way to the rest of this object's work (see `upstream/call.ts`). */
  readPauses: number;
  /** Times a call began to hold streamed tokens so that they leave together (see `tokenHoldMs`). */
  holds: number;
}

/** One recent upstream call, as `snapshot` lists it. */
export interface BatchRecord {
  batchId: string;
  originId: string;
  reason: FlushReason;
  /** Item ids in the order the origin received them. */
  items: string[];
}

/** How many recent calls `snapshot` lists. */
export const RECENT_BATCHES = 32;

/** What `snapshot` shows. */
export interface BatcherSnapshot {
  version: string | null;
  queued: number;
  /** Requests waiting in each lane, highest priority first. */
  lanes: number[];
  /** The window a request arriving now would wait, ms. */
  windowMs: number;
  /**
   * How late this object's thread has recently run work it was given, ms (a decaying mean;
   * 0 when not measured lately): near 0 unless the thread is saturated, when the window
   * grows with it and more shards would help.
   */
  threadLagMs: number;
  /** How long a streamed item's later tokens may be held now to leave together, ms. */
  holdMs: number;
  /** Items this batcher has running per origin. */
  inFlight: Record<string, number>;
  /**
   * Each origin's last load report as this batcher uses it (tokens, not blocks), with its
   * age; null before the first. `stepMs` is the engine's reported step time (0: none).
   */
  origins: Record<string, (OriginLoadView & { ageMs: number }) | null>;
  /** The router's index and placements; null where routing is off. */
  routing: RouterView | null;
  /** Upstream calls whose response has not ended. */
  openBatches: number;
  /** Rows in `open_batches` (this incarnation's calls plus orphans not yet cancelled). */
  persistedBatches: number;
  counters: BatcherCounters;
  /** The latest upstream calls, oldest first. */
  recentBatches: BatchRecord[];
}

/** Upper bounds of a Batcher's queue-wait buckets, ms (docs/metrics.md). */
export const QUEUE_WAIT_BOUNDS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 30_000];
