/**
 * Reads an item's frames as {@link ItemEvent}s behind the {@link OpenItem} interface, over
 * the batch protocol's upstream client (contracts/upstream.ts). `openItem`
 * sends one request as a batch of one (the unbatched path); the `Batcher` Durable Object
 * sends many items per call with the same helpers and hands each caller the same events.
 */
import type { OriginConfig } from "./config.ts";
import type { OriginFailureKind } from "../contracts/errors.ts";
import {
  BATCH_PROTOCOL_VERSION,
  type BatchRequest,
  FrameType,
  type ItemHead,
  type ItemPath,
  type ItemTrailer,
  type LoadReport,
  concatBytes,
  decodeJsonPayload,
} from "../contracts/protocol.ts";
import {
  type FrameReader,
  type UpstreamOrigin,
  batchAnswerProblem,
  cancelBatchItems,
  describe,
  frameList,
  frameReader,
  postBatch,
} from "../contracts/upstream.ts";

/** What happens next in an item's response after its HEAD. */
export type ItemEvent =
  | { kind: "data"; bytes: Uint8Array }
  | { kind: "end"; trailer: ItemTrailer }
  /** The connection broke or the framing was bad before the item's END. */
  | { kind: "broken"; detail: string };

/**
 * An item whose origin answered with a HEAD. The same shape whether the item travelled
 * alone (`openItem`) or in a batch through the `Batcher` (`functions/batcher-client.ts`).
 */
export interface OpenItem {
  head: ItemHead;
  /**
   * Present when the upstream streams the item's body apart from its frames (the `Batcher`,
   * for streaming answers): `next` then yields only the END or `broken`, never `data`.
   */
  piped?: PipedBody;
  /** The next event; never rejects. After `end` or `broken` there are no more. */
  next(): Promise<ItemEvent>;
  /** Stops the item: the origin cancels it and frees its slot. */
  cancel(): void;
  /**
   * Cancels the item on its origin but reads on to its END, whose usage counts what was
   * generated before the cancel (for billing a client that went away); resolves with that
   * trailer, or null when none came within `waitMs`, and then stops as {@link cancel} does.
   */
  cancelForUsage(waitMs: number): Promise<ItemTrailer | null>;
}

/**
 * An item body the upstream streams apart from its frames, which the edge gives the client
 * as it is. The upstream ends it with OpenAI's error event when the item fails after its
 * HEAD, so the client never takes a cut answer for a whole one; the edge only reads the
 * item's END to bill it.
 */
export interface PipedBody {
  /** The item's body: the client's response body as it is. */
  body: ReadableStream<Uint8Array>;
  /**
   * The client went away: the item is cancelled on its origin, and its END (with the usage
   * generated until then) still comes through `next`.
   */
  clientGone(): void;
  /** The request timed out: the body ends with a timeout error event, and the item stops. */
  timeOut(): void;
}

/** The outcome of one attempt at an origin; `originId` names the origin that was tried. */
export type ItemAttempt =
  | { kind: "open"; item: OpenItem; originId: string }
  | {
      kind: "failed";
      failure: OriginFailureKind;
      detail: string;
      /** The origin that failed, or null when none was reached (no healthy origin). */
      originId: string | null;
    };

/** What to send and how long to wait. */
export interface OpenItemOptions {
  requestId: string;
  /** The origin's access token (the edge's `ORIGIN_TOKEN`), when it requires one. */
  originToken?: string | undefined;
  path: ItemPath;
  body: string;
  headers: Record<string, string>;
  /** Give up when the origin has not answered within this many ms (see `waitForHead`). */
  firstByteTimeoutMs: number;
  /**
   * Whether the first-byte timeout also covers the item's HEAD. Engines send a streaming
   * answer's headers at once but a non-streaming answer's only when it is complete, so for
   * those only the batch call's own headers are timed.
   */
  timeHead: boolean;
  /** The origin gives up on the item after this many ms (outcome `timeout`). */
  itemTimeoutMs: number;
  /** Called with each load report the origin piggybacks on the response. */
  onLoad?: (report: LoadReport) => void;
  /**
   * Read the batch response whole before looking at its frames: for a JSON answer, which
   * the engine sends at once when it is complete, one read instead of one per chunk.
   */
  readWhole?: boolean;
}

/** Reason an attempt's abort carries when its first-byte timer fired. */
export const FIRST_BYTE_TIMEOUT = "first byte timeout";

/**
 * `first` joined with the DATA frames that arrived with it: bytes that came together leave
 * together, in one write to the client instead of one per frame (the bytes and their
 * order are unchanged, and nothing waits for more).
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

/**
 * The {@link OpenItem} of an item whose HEAD has been read: its DATA and END frames from
 * `frames` (LOAD frames go to `onLoad`), until END or until reading stops.
 */
export function openItemFromFrames(
  head: ItemHead,
  frames: FrameReader,
  cancel: () => void,
  onLoad?: (report: LoadReport) => void,
  /**
   * Asks the upstream to cancel the item while its frames keep coming up to END; without
   * it, `cancelForUsage` cancels outright and resolves with null.
   */
  requestCancel?: () => Promise<unknown>,
): OpenItem {
  let finished = false;
  // The item's END once read, whoever read it (a reader may still be waiting when it comes).
  let trailer: ItemTrailer | null = null;
  const readNext = async (): Promise<ItemEvent> => {
    if (finished) return { kind: "broken", detail: "item already finished" };
    for (;;) {
      const frame = await frames.next();
      if (typeof frame === "string") {
        finished = true;
        return { kind: "broken", detail: frame };
      }
      switch (frame.type) {
        case FrameType.DATA:
          return { kind: "data", bytes: withReadyData(frames, frame.payload) };
        case FrameType.END:
          finished = true;
          trailer = decodeJsonPayload(frame.payload) as ItemTrailer;
          return { kind: "end", trailer };
        case FrameType.LOAD:
          onLoad?.(decodeJsonPayload(frame.payload) as LoadReport);
          break;
        case FrameType.HEAD:
          finished = true;
          return { kind: "broken", detail: "second HEAD for the item" };
      }
    }
  };
  // One read at a time, each behind the one before: a client that goes away while the
  // body's pull waits for a frame drains the item behind that read (`cancelForUsage`), and
  // the runtime's streams refuse a second pending read, which would lose the END and with
  // it the usage to bill.
  let reading: Promise<ItemEvent> | null = null;
  const item: OpenItem = {
    head,
    next() {
      const event = reading === null ? readNext() : reading.then(readNext);
      reading = event;
      return event;
    },
    cancel() {
      finished = true;
      cancel();
    },
    async cancelForUsage(waitMs) {
      if (finished || requestCancel === undefined) {
        item.cancel();
        return trailer;
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      const gaveUp = new Promise<null>((resolve) => {
        timer = setTimeout(() => resolve(null), waitMs);
      });
      const drained = (async () => {
        await requestCancel().catch(() => {});
        for (;;) {
          const event = await item.next();
          if (event.kind !== "data") return trailer;
        }
      })();
      const result = await Promise.race([drained, gaveUp]);
      if (timer !== undefined) clearTimeout(timer);
      item.cancel();
      return result ?? trailer;
    },
  };
  return item;
}

/** Posts a one-item batch to `origin` and waits for the item's HEAD. Never rejects. */
export async function openItem(
  origin: OriginConfig,
  options: OpenItemOptions,
): Promise<ItemAttempt> {
  const upstream: UpstreamOrigin = { url: origin.url, token: options.originToken };
  const batch: BatchRequest = {
    v: BATCH_PROTOCOL_VERSION,
    batch_id: options.requestId,
    items: [
      {
        id: options.requestId,
        path: options.path,
        headers: options.headers,
        body: options.body,
        timeout_ms: options.itemTimeoutMs,
      },
    ],
  };
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(FIRST_BYTE_TIMEOUT), options.firstByteTimeoutMs);
  const failed = (failure: OriginFailureKind, detail: string): ItemAttempt => {
    clearTimeout(timer);
    abort.abort("attempt abandoned");
    return {
      kind: "failed",
      failure: abort.signal.reason === FIRST_BYTE_TIMEOUT ? "timeout" : failure,
      detail,
      originId: origin.id,
    };
  };

  let response: Response;
  try {
    response = await postBatch(upstream, batch, abort.signal);
  } catch (error) {
    return failed("unavailable", `connect: ${describe(error)}`);
  }
  const problem = batchAnswerProblem(response);
  if (problem !== null || response.body === null) {
    await response.body?.cancel().catch(() => {});
    return failed(problem?.failure ?? "bad_answer", problem?.detail ?? "no body");
  }
  if (!options.timeHead) clearTimeout(timer);

  let frames: FrameReader;
  if (options.readWhole === true) {
    // The origin ends the item by its own timeout; this only bounds a call that never ends.
    const stuck = setTimeout(() => abort.abort("item never ended"), options.itemTimeoutMs + 5_000);
    try {
      frames = frameList(new Uint8Array(await response.arrayBuffer()));
    } catch (error) {
      return failed("bad_answer", `read: ${describe(error)}`);
    } finally {
      clearTimeout(stuck);
    }
  } else {
    frames = frameReader(response.body);
  }
  let head: ItemHead | undefined;
  while (head === undefined) {
    const frame = await frames.next();
    if (typeof frame === "string") return failed("bad_answer", frame);
    switch (frame.type) {
      case FrameType.LOAD:
        options.onLoad?.(decodeJsonPayload(frame.payload) as LoadReport);
        break;
      case FrameType.HEAD:
        head = decodeJsonPayload(frame.payload) as ItemHead;
        break;
      case FrameType.END: {
        const trailer = decodeJsonPayload(frame.payload) as ItemTrailer;
        const failure = trailer.outcome === "timeout" ? "timeout" : "bad_answer";
        return failed(
          failure,
          `item ended before its HEAD: ${trailer.error?.message ?? trailer.outcome}`,
        );
      }
      case FrameType.DATA:
        return failed("bad_answer", "DATA before HEAD");
    }
  }
  clearTimeout(timer);
  // For a batch of one, closing the call cancels the item on the origin.
  const item = openItemFromFrames(
    head,
    frames,
    () => abort.abort("client went away"),
    options.onLoad,
    () => cancelBatchItems(upstream, options.requestId, [options.requestId]),
  );
  return { kind: "open", item, originId: origin.id };
}
