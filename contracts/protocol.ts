/**
 * The warmgate batch protocol between the edge and an origin (see origin/PROTOCOL.md).
 *
 * Pure and runtime-neutral (Web streams and typed arrays only), so the origin (Node)
 * encodes with it and the edge (workerd) decodes with it.
 */

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
/** Media type of a batch response body. */
export const BATCH_CONTENT_TYPE = "application/x-warmgate-batch";
/** Bytes in a frame header: type (u8), item (u16 BE), payload length (u32 BE). */
export const FRAME_HEADER_BYTES = 7;
/** `item` value of frames that concern the whole batch (load reports). */
export const BATCH_ITEM = 0xffff;
/** Largest number of items in one batch (item indexes are u16, 0xffff is reserved). */
export const MAX_BATCH_ITEMS = 0xfffe;

/** Frame types. */
export const FrameType = {
  /** JSON {@link ItemHead}: the item's HTTP status and headers; once, before any DATA. */
  HEAD: 1,
  /** Raw bytes of the item's response body, exactly as the engine wrote them. */
  DATA: 2,
  /** JSON {@link ItemTrailer}: outcome and usage; once, the item's last frame. */
  END: 3,
  /** JSON {@link LoadReport} about the origin; item is {@link BATCH_ITEM}. */
  LOAD: 4,
} as const;
/** A frame type number. */
export type FrameType = (typeof FrameType)[keyof typeof FrameType];

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
export interface BatchItem {
  /** Unique id of the request (the edge's `x-request-id`). */
  id: string;
  /** OpenAI-compatible path the item is for. */
  path: ItemPath;
  /** Request headers worth forwarding to the engine (lower-case names). */
  headers?: Record<string, string>;
  /** The client's request body, as raw JSON text, so unknown fields travel untouched. */
  body: string;
  /** Give up on the item after this many milliseconds (outcome `timeout`). */
  timeout_ms?: number;
  /** Higher runs first when the engine has to queue. */
  priority?: number;
}

/** Body of `POST /v1/batch`. */
export interface BatchRequest {
  v: typeof BATCH_PROTOCOL_VERSION;
  /** Unique id of the batch, used by the cancel endpoint. */
  batch_id: string;
  items: BatchItem[];
  /**
   * The block events this caller has seen from the origin's log: the call's LOAD frames
   * bring the ones after it (see {@link KvEvents}). Absent: send none.
   */
  kv_events_after?: KvEventCursor;
}

/** A place in an origin's log of block events. */
export interface KvEventCursor {
  /** The log's identity; a new one (the origin restarted) starts from nothing. */
  log: string;
  /** The last event seen (0: none). */
  seq: number;
}

/**
 * What the origin's engine stored in and dropped from its prefix cache since a cursor, as
 * the edge's block hashes (contracts/prefix-blocks.ts) of the prompts it served.
 */
export interface KvEvents extends KvEventCursor {
  stored: number[];
  removed: number[];
  /**
   * The engine's whole state follows (a caller of another log, or further behind than the
   * log keeps): forget what was known before `stored`.
   */
  cleared: boolean;
}

/** Body of `POST /v1/batch/cancel`: a batch, items, or both (at least one). */
export interface CancelRequest {
  /** The batch; absent, each item is found in whichever batch runs it. */
  batch_id?: string;
  /** Item ids to cancel; absent means every unfinished item of the batch. */
  ids?: string[];
}

/** Payload of a HEAD frame. */
export interface ItemHead {
  id: string;
  status: number;
  headers: Record<string, string>;
}

/** Token usage of one item, as the engine reported it. */
export interface ItemUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** Prompt tokens served from the prefix cache. */
  cached_tokens: number;
}

/** How an item ended. */
export type ItemOutcome = "ok" | "error" | "cancelled" | "timeout";

/** Payload of an END frame. */
export interface ItemTrailer {
  id: string;
  outcome: ItemOutcome;
  /** Usage when the engine reported it (also for errors after tokens were produced). */
  usage: ItemUsage | null;
  /** Why the item failed; present when outcome is not `ok`. */
  error?: { message: string; type: string; code: string | null };
  /** Milliseconds: queued before the engine started it, to the first body byte, in all. */
  timing?: { queued_ms: number; ttft_ms: number | null; total_ms: number };
}

/** Body of `POST /v1/batch/outcomes`: request ids (an item id up to its first `.`). */
export interface OutcomesRequest {
  ids: string[];
}

/** One item of a looked-up request, as its origin last saw it. */
export type ItemRecord =
  | { id: string; state: "running" }
  | { id: string; state: "ended"; outcome: ItemOutcome; usage: ItemUsage | null };

/** Answer of `POST /v1/batch/outcomes`: every item the origin remembers for those ids. */
export interface OutcomesResponse {
  items: ItemRecord[];
}

/** The request an item id belongs to: a retry's attempt id is the request id, `.`, a number. */
export function requestIdOf(itemId: string): string {
  const dot = itemId.indexOf(".");
  return dot < 0 ? itemId : itemId.slice(0, dot);
}

/** Payload of a LOAD frame: the origin's state when it was written. */
export interface LoadReport {
  /** Origin's identity (its `--origin-id`). */
  origin: string;
  /** Milliseconds since the epoch. */
  t: number;
  /** Sequences being generated. */
  running: number;
  /** Sequences waiting for a slot or for KV memory. */
  waiting: number;
  /** Fraction of KV blocks in use, 0..1. */
  kv_usage: number;
  /** KV blocks free or evictable. */
  kv_free_blocks: number;
  /** KV blocks in all. */
  kv_total_blocks: number;
  /** Tokens per KV block. */
  block_size: number;
  /** Prompt tokens looked up in the prefix cache since start. */
  prefix_queries: number;
  /** Of those, tokens found. */
  prefix_hits: number;
  /** Most sequences the engine runs at once. */
  max_num_seqs: number;
  /**
   * Recent mean duration of one engine step in ms, about the time between two tokens of a
   * running sequence (vLLM's inter-token latency); the engine starts new sequences only at
   * step boundaries. Absent or 0 when unknown.
   */
  step_ms?: number;
  /** Prompt tokens per second the engine prefills, when it knows. */
  prefill_tokens_per_s?: number;
  /** Prompt tokens the engine still has to prefill (queued and in progress), when it knows. */
  prefill_backlog_tokens?: number;
  /** Block events since the call's `kv_events_after`, where the engine reports them. */
  kv_events?: KvEvents;
}

/** A decoded frame. `payload` may be a view into the chunk it arrived in. */
export interface Frame {
  type: FrameType;
  item: number;
  payload: Uint8Array;
}

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

/** Encodes one frame (header and payload in a single buffer, so it goes out in one write). */
export function encodeFrame(type: FrameType, item: number, payload: Uint8Array): Uint8Array {
  if (!Number.isInteger(item) || item < 0 || item > BATCH_ITEM) {
    throw new RangeError(`frame item out of range: ${item}`);
  }
  const out = new Uint8Array(FRAME_HEADER_BYTES + payload.byteLength);
  const view = new DataView(out.buffer);
  view.setUint8(0, type);
  view.setUint16(1, item);
  view.setUint32(3, payload.byteLength);
  out.set(payload, FRAME_HEADER_BYTES);
  return out;
}

/** Encodes a frame whose payload is JSON. */
export function encodeJsonFrame(type: FrameType, item: number, value: unknown): Uint8Array {
  return encodeFrame(type, item, encodeJsonPayload(value));
}

/** A JSON frame payload (HEAD, END or LOAD) without its frame; see {@link decodeJsonPayload}. */
export function encodeJsonPayload(value: unknown): Uint8Array {
  return textEncoder.encode(JSON.stringify(value));
}

/** Parses a JSON frame payload (HEAD, END or LOAD); the frame type tells its shape. */
export function decodeJsonPayload(payload: Uint8Array): unknown {
  return JSON.parse(textDecoder.decode(payload));
}

function isFrameType(n: number): n is FrameType {
  return n >= FrameType.HEAD && n <= FrameType.LOAD;
}

/** Thrown when a batch body is not valid framing (a bug or a truncated connection). */
export class FramingError extends Error {
  override name = "FramingError";
}

/**
 * Incremental frame decoder: push chunks as they arrive, get whole frames back.
 * Payloads that lie within one chunk are views, not copies.
 */
export class FrameDecoder {
  #buffered: Uint8Array[] = [];
  #bufferedBytes = 0;

  /** Bytes held back because they do not yet form a whole frame. */
  get pendingBytes(): number {
    return this.#bufferedBytes;
  }

  /** Feeds a chunk and returns every frame it completes. */
  push(chunk: Uint8Array): Frame[] {
    const frames: Frame[] = [];
    let data = chunk;
    if (this.#bufferedBytes > 0) {
      this.#buffered.push(chunk);
      data = concatBytes(this.#buffered, this.#bufferedBytes + chunk.byteLength);
      this.#buffered = [];
      this.#bufferedBytes = 0;
    }
    let offset = 0;
    while (data.byteLength - offset >= FRAME_HEADER_BYTES) {
      const view = new DataView(data.buffer, data.byteOffset + offset, FRAME_HEADER_BYTES);
      const type = view.getUint8(0);
      const item = view.getUint16(1);
      const length = view.getUint32(3);
      if (!isFrameType(type)) throw new FramingError(`unknown frame type ${type}`);
      const end = offset + FRAME_HEADER_BYTES + length;
      if (end > data.byteLength) break;
      frames.push({ type, item, payload: data.subarray(offset + FRAME_HEADER_BYTES, end) });
      offset = end;
    }
    if (offset < data.byteLength) {
      const rest = data.subarray(offset);
      this.#buffered.push(rest);
      this.#bufferedBytes = rest.byteLength;
    }
    return frames;
  }

  /** Call at end of input; throws if a partial frame was left over. */
  finish(): void {
    if (this.#bufferedBytes > 0) {
      throw new FramingError(`batch body ended inside a frame (${this.#bufferedBytes} bytes)`);
    }
  }
}

/**
 * Joins byte chunks into one buffer; `total` is their summed length when already known. A
 * single chunk is returned as it is, without a copy.
 */
export function concatBytes(
  parts: readonly Uint8Array[],
  total = parts.reduce((sum, part) => sum + part.byteLength, 0),
): Uint8Array {
  const [only] = parts;
  if (parts.length === 1 && only !== undefined) return only;
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

/** Reads a batch response body frame by frame. */
export async function* readFrames(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame> {
  const decoder = new FrameDecoder();
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      yield* decoder.push(value);
    }
    decoder.finish();
  } finally {
    reader.releaseLock();
  }
}
