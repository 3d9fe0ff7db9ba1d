/**
 * The batch protocol's framing (origin/PROTOCOL.md, "Frames"): how a batch answer's body
 * is cut into HEAD, DATA, END and LOAD frames. A JSON payload is checked against its schema
 * (schema.ts) as its frame is decoded, once per hop; DATA bytes are never parsed. Pure and
 * runtime-neutral (Web streams and typed arrays only): the origin encodes, the edge decodes.
 */
import type { z } from "zod";
import {
  type ItemHead,
  ItemHeadSchema,
  type ItemTrailer,
  ItemTrailerSchema,
  type LoadReport,
  LoadReportSchema,
} from "./schema.ts";

/** Media type of a batch response body. */
export const BATCH_CONTENT_TYPE = "application/x-warmgate-batch";
/** Media type of a raw batch answer: frames up to the item's HEAD, then its body unframed. */
export const RAW_BATCH_CONTENT_TYPE = "application/x-warmgate-batch-raw";
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

/**
 * A decoded frame. `payload` may be a view into the chunk it arrived in; a JSON frame also
 * carries its payload read and checked (`head`, `trailer`, `report`).
 */
export type Frame =
  | { type: typeof FrameType.HEAD; item: number; payload: Uint8Array; head: ItemHead }
  | { type: typeof FrameType.DATA; item: number; payload: Uint8Array }
  | { type: typeof FrameType.END; item: number; payload: Uint8Array; trailer: ItemTrailer }
  | { type: typeof FrameType.LOAD; item: number; payload: Uint8Array; report: LoadReport };

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

/** A JSON frame payload (HEAD, END or LOAD) without its frame; see {@link parsePayload}. */
export function encodeJsonPayload(value: unknown): Uint8Array {
  return textEncoder.encode(JSON.stringify(value));
}

/**
 * A JSON payload (a frame's, or an END's trailer handed on without its frame) read with
 * `schema`; null when it is not JSON or not of that shape.
 */
export function parsePayload<T>(schema: z.ZodType<T>, payload: Uint8Array): T | null {
  let value: unknown;
  try {
    value = JSON.parse(payloadText(payload));
  } catch {
    return null;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : null;
}

// Longest payload read as ASCII in JavaScript (an argument list of its bytes).
const SHORT_PAYLOAD_BYTES = 4096;

/**
 * A JSON payload's text. Frames' payloads are short and ASCII (headers, usage, load): read
 * here they skip a call into the runtime's decoder, which costs more than the reading;
 * anything longer or beyond ASCII goes to the decoder.
 */
function payloadText(payload: Uint8Array): string {
  if (payload.byteLength > SHORT_PAYLOAD_BYTES) return textDecoder.decode(payload);
  for (let i = 0; i < payload.byteLength; i++) {
    if ((payload[i] as number) >= 0x80) return textDecoder.decode(payload);
  }
  return String.fromCharCode.apply(null, payload as unknown as number[]);
}

/** Thrown when a batch body is not valid framing (a bug or a truncated connection). */
export class FramingError extends Error {
  override name = "FramingError";
}

/**
 * A frame from its header fields and payload, a JSON payload read and checked against its
 * schema. A payload that is not its frame's shape is bad framing: {@link FramingError}.
 */
export function decodeFrame(type: number, item: number, payload: Uint8Array): Frame {
  switch (type) {
    case FrameType.DATA:
      return { type, item, payload };
    case FrameType.HEAD:
      return { type, item, payload, head: checked(ItemHeadSchema, payload, "HEAD") };
    case FrameType.END:
      return { type, item, payload, trailer: checked(ItemTrailerSchema, payload, "END") };
    case FrameType.LOAD:
      return { type, item, payload, report: checked(LoadReportSchema, payload, "LOAD") };
    default:
      throw new FramingError(`unknown frame type ${type}`);
  }
}

function checked<T>(schema: z.ZodType<T>, payload: Uint8Array, name: string): T {
  const value = parsePayload(schema, payload);
  if (value === null) throw new FramingError(`malformed ${name} payload`);
  return value;
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

  /**
   * Feeds a chunk and returns every frame it completes; throws {@link FramingError}. With
   * `untilHead`, decoding stops after a HEAD: the bytes behind it wait in {@link rest}.
   */
  push(chunk: Uint8Array, untilHead = false): Frame[] {
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
      if (type < FrameType.HEAD || type > FrameType.LOAD) {
        throw new FramingError(`unknown frame type ${type}`);
      }
      const end = offset + FRAME_HEADER_BYTES + length;
      if (end > data.byteLength) break;
      frames.push(decodeFrame(type, item, data.subarray(offset + FRAME_HEADER_BYTES, end)));
      offset = end;
      if (untilHead && type === FrameType.HEAD) break;
    }
    if (offset < data.byteLength) {
      const rest = data.subarray(offset);
      this.#buffered.push(rest);
      this.#bufferedBytes = rest.byteLength;
    }
    return frames;
  }

  /** The bytes held back, taken: after a HEAD decoded `untilHead`, the raw body's start. */
  rest(): Uint8Array {
    const rest = concatBytes(this.#buffered, this.#bufferedBytes);
    this.#buffered = [];
    this.#bufferedBytes = 0;
    return rest;
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

/** Reads a batch response body frame by frame; throws {@link FramingError} on bad framing. */
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
