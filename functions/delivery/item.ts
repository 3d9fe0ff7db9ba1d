/**
 * An item whose origin answered with a HEAD, as the edge delivers it (docs/edge.md,
 * "Delivery"): its body as a stream for the client or read whole, and how it ended. The same
 * shape whether it came straight from an origin or through the `Batcher`; this module builds
 * it from an item's frames.
 */
import { errorEvent, originFailure } from "../../contracts/errors.ts";
import { refusedBusy, retryAfterOf } from "../../contracts/origin-health.ts";
import {
  type ItemHead,
  type ItemTrailer,
  type LoadReport,
} from "../../contracts/protocol/schema.ts";
import { type Frame, FrameType, concatBytes } from "../../contracts/protocol/framing.ts";
import type { FrameReader } from "../../contracts/upstream.ts";

/** How an item ended: its END, or why none came. */
export type ItemEnd =
  | { kind: "end"; trailer: ItemTrailer }
  /** The connection broke, the framing was bad, or the item was stopped before its END. */
  | { kind: "broken"; detail: string }
  /** A raw body that ended whole (`raw-item.ts`): its END is its origin's outcome record. */
  | { kind: "closed" };

/** An item's body on its way to the client. */
export interface ItemStream {
  /** The client's response body, as it is. */
  body: ReadableStream<Uint8Array>;
  /** Settles once, with how the item ended; never rejects. */
  ended: Promise<ItemEnd>;
  /** The client went away: the item is cancelled on its origin; its END still comes. */
  clientGone(): void;
  /** The request timed out: the body ends with a timeout error event, and the item stops. */
  timeOut(): void;
  /** When the first body bytes went to the client (epoch ms), null before. */
  firstByteAt(): number | null;
}

/** An item with its HEAD; `stream` or `whole` is called once, `cancel` at any time. */
export interface OpenItem {
  head: ItemHead;
  /** The body as a stream; `onClientGone` hears of a client that cancelled it. */
  stream(onClientGone: () => void): ItemStream;
  /** The whole body and how the item ended. */
  whole(): Promise<{ body: Uint8Array; end: ItemEnd }>;
  /** Stops the item: the origin cancels it and frees its slot. */
  cancel(): void;
}

/** How a frame-read item is stopped on its origin. */
export interface FrameItemControls {
  /** Stops it outright (closes its call, or cancels it). */
  cancel(): void;
  /** Asks the origin to cancel it while its frames keep coming up to its END. */
  cancelUntilEnd?: () => Promise<unknown>;
  /** Each load report the origin piggybacks on the answer. */
  onLoad?: (report: LoadReport) => void;
  /** The item's frames ended: its END came, or reading stopped. */
  onDone?: () => void;
}

/** The {@link OpenItem} of an item whose HEAD was read: its DATA and END from `frames`. */
export function frameItem(
  head: ItemHead,
  frames: FrameReader,
  controls: FrameItemControls,
): OpenItem {
  const events = new FrameEvents(frames, controls.onLoad, controls.onDone);
  const cancel = () => {
    events.stop();
    controls.cancel();
  };
  return {
    head,
    cancel,
    async whole() {
      const chunks: Uint8Array[] = [];
      for (;;) {
        const event = await events.next();
        if (event.kind !== "data") return { body: concatBytes(chunks), end: event };
        chunks.push(event.bytes);
      }
    },
    stream(onClientGone) {
      const { promise: ended, resolve: resolveEnded } = Promise.withResolvers<ItemEnd>();
      let done = false;
      let gone = false;
      let firstByteAt: number | null = null;
      // A runtime pipe, not a stream of our own: the runtime hands its bytes to the client
      // without a call into JavaScript per read (docs/benchmarks.md, "Where one request's CPU
      // goes"). Each write resolves once the client read it: the origin's pace reaches the
      // client unbuffered.
      const { readable, writable } = new IdentityTransformStream();
      const writer = writable.getWriter();
      const end = (how: ItemEnd, failure: "timeout" | "bad_answer" | null) => {
        if (done) return;
        done = true;
        // A failure after the HEAD ends the body with the OpenAI error event; an engine's
        // own error answer (a 4xx) is whole as it is. A client already gone refuses both.
        if (failure !== null && head.status < 400) {
          writer.write(errorEvent(originFailure(failure))).catch(() => {});
        }
        writer.close().catch(() => {});
        resolveEnded(how);
      };
      const clientGone = () => {
        if (gone || done) return;
        gone = true;
        if (controls.cancelUntilEnd === undefined) {
          cancel();
          end({ kind: "broken", detail: "cancelled" }, null);
          return;
        }
        // Read on behind any waiting read: the END brings the usage generated until now.
        void controls.cancelUntilEnd().catch(() => {});
        void (async () => {
          for (;;) {
            const event = await events.next();
            if (event.kind === "data") continue;
            end(event, null);
            return;
          }
        })();
      };
      // The client went away: its read was cancelled, which errors the pipe's writer.
      let left = false;
      const clientLeft = () => {
        if (left || done) return;
        left = true;
        clientGone();
        onClientGone();
      };
      writer.closed.catch(clientLeft);
      void (async () => {
        for (;;) {
          if (done || gone) return;
          const event = await events.next();
          // A read that was waiting when the client left still takes its bytes; the drain
          // behind it takes the END.
          if (done || (gone && event.kind !== "data")) return;
          switch (event.kind) {
            case "data":
              if (event.bytes.byteLength === 0) continue;
              firstByteAt ??= Date.now();
              if (gone) {
                writer.write(event.bytes).catch(() => {});
                return;
              }
              try {
                await writer.write(event.bytes);
              } catch {
                clientLeft();
                return;
              }
              continue;
            case "end":
              end(event, failureOf(event.trailer));
              return;
            case "broken":
              end(event, "bad_answer");
              return;
          }
        }
      })();
      return {
        body: readable,
        ended,
        clientGone,
        timeOut() {
          cancel();
          end({ kind: "broken", detail: "request timeout" }, "timeout");
        },
        firstByteAt: () => firstByteAt,
      };
    },
  };
}

/** The failure an END reports after the HEAD, or null for an item that ended well. */
function failureOf(trailer: ItemTrailer): "timeout" | "bad_answer" | null {
  if (trailer.outcome === "ok") return null;
  return trailer.outcome === "timeout" ? "timeout" : "bad_answer";
}

type FrameEvent = ItemEnd | { kind: "data"; bytes: Uint8Array };

/**
 * An item's frames as events, one read at a time, each behind the one before: a client that
 * goes away while the body's read waits drains the item behind that read, and the runtime's
 * streams refuse a second pending read, which would lose the END and the usage to bill.
 */
class FrameEvents {
  readonly #frames: FrameReader;
  readonly #onLoad: ((report: LoadReport) => void) | undefined;
  readonly #onDone: (() => void) | undefined;
  #finished = false;
  #reading: Promise<FrameEvent> | null = null;

  constructor(frames: FrameReader, onLoad?: (report: LoadReport) => void, onDone?: () => void) {
    this.#frames = frames;
    this.#onLoad = onLoad;
    this.#onDone = onDone;
  }

  next(): Promise<FrameEvent> {
    const event = this.#reading === null ? this.#read() : this.#reading.then(() => this.#read());
    this.#reading = event;
    return event;
  }

  stop(): void {
    this.#finished = true;
    this.#frames.cancel();
    this.#onDone?.();
  }

  async #read(): Promise<FrameEvent> {
    const event = await this.#readFrame();
    if (event.kind !== "data") this.#onDone?.();
    return event;
  }

  async #readFrame(): Promise<FrameEvent> {
    if (this.#finished) return { kind: "broken", detail: "item stopped" };
    for (;;) {
      const frame = await this.#frames.next();
      if (typeof frame === "string") {
        this.#finished = true;
        return { kind: "broken", detail: frame };
      }
      switch (frame.type) {
        case FrameType.DATA:
          return { kind: "data", bytes: withReadyData(this.#frames, frame.payload) };
        case FrameType.END:
          this.#finished = true;
          return { kind: "end", trailer: frame.trailer };
        case FrameType.LOAD:
          this.#onLoad?.(frame.report);
          break;
        case FrameType.HEAD:
          this.#finished = true;
          return { kind: "broken", detail: "second HEAD for the item" };
      }
    }
  }
}

/**
 * `first` joined with the DATA frames that arrived with it: bytes that came together leave
 * together, in one write to the client (the bytes and their order unchanged; nothing waits).
 */
function withReadyData(frames: FrameReader, first: Uint8Array): Uint8Array {
  let next = frames.takeReadyData();
  if (next === undefined) return first;
  const parts = [first];
  while (next !== undefined) {
    parts.push(next);
    next = frames.takeReadyData();
  }
  return concatBytes(parts);
}

/** A {@link FrameReader} over frames already in memory. */
export function memoryFrames(frames: readonly Frame[]): FrameReader {
  let at = 0;
  return {
    async next() {
      return frames[at++] ?? "the item ended without an END";
    },
    takeReadyData: () => undefined,
    cancel() {
      at = frames.length;
    },
  };
}

/**
 * A whole call that its origin refused for overload (429, or 503 with `retry-after`: an
 * origin at its connection cap) as the {@link OpenItem} of its one item, whose HEAD says the
 * same; null for any other answer, whose body is left unread.
 */
export async function refusedItem(itemId: string, response: Response): Promise<OpenItem | null> {
  if (!refusedBusy(response)) return null;
  const headers = retryAfterOf(response);
  const type = response.headers.get("content-type");
  if (type !== null) headers["content-type"] = type;
  const body = new Uint8Array(await response.arrayBuffer().catch(() => new ArrayBuffer(0)));
  return busyItem(itemId, response.status, headers, body);
}

/** An item refused for overload before it ran, with the HEAD and body that say so. */
export function busyItem(
  itemId: string,
  status: number,
  headers: Record<string, string>,
  body: Uint8Array,
): OpenItem {
  const frames = memoryFrames([
    { type: FrameType.DATA, item: 0, payload: body },
    {
      type: FrameType.END,
      item: 0,
      payload: new Uint8Array(0),
      trailer: { id: itemId, outcome: "error", usage: null },
    },
  ]);
  return frameItem({ id: itemId, status, headers }, frames, { cancel() {} });
}
