/**
 * Sends one request to an origin as a batch of one over the batch protocol and reads its
 * frames: the item's HEAD first, then its body bytes and END as {@link ItemEvent}s. A
 * batcher later sends many items per call and hands each caller the same events.
 */
import type { OriginConfig } from "./config.ts";
import type { OriginFailureKind } from "./errors.ts";
import {
  BATCH_CONTENT_TYPE,
  BATCH_PATH,
  BATCH_PROTOCOL_VERSION,
  type BatchRequest,
  type Frame,
  FrameType,
  type ItemHead,
  type ItemPath,
  type ItemTrailer,
  type LoadReport,
  decodeJsonPayload,
  readFrames,
} from "../origin/protocol.ts";

/** What happens next in an item's response after its HEAD. */
export type ItemEvent =
  | { kind: "data"; bytes: Uint8Array }
  | { kind: "end"; trailer: ItemTrailer }
  /** The connection broke or the framing was bad before the item's END. */
  | { kind: "broken"; detail: string };

/** An item whose origin answered with a HEAD. */
export interface OpenItem {
  head: ItemHead;
  /** The next event; never rejects. After `end` or `broken` there are no more. */
  next(): Promise<ItemEvent>;
  /** Stops the upstream call (for a batch of one, that cancels the item on the origin). */
  cancel(): void;
}

/** The outcome of one attempt at an origin. */
export type ItemAttempt =
  | { kind: "open"; item: OpenItem }
  | { kind: "failed"; failure: OriginFailureKind; detail: string };

/** What to send and how long to wait. */
export interface OpenItemOptions {
  requestId: string;
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
}

const TIMEOUT = "first byte timeout";

/** Posts a one-item batch to `origin` and waits for the item's HEAD. Never rejects. */
export async function openItem(
  origin: OriginConfig,
  options: OpenItemOptions,
): Promise<ItemAttempt> {
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
  const timer = setTimeout(() => abort.abort(TIMEOUT), options.firstByteTimeoutMs);
  const failed = (failure: OriginFailureKind, detail: string): ItemAttempt => {
    clearTimeout(timer);
    abort.abort("attempt abandoned");
    return {
      kind: "failed",
      failure: abort.signal.reason === TIMEOUT ? "timeout" : failure,
      detail,
    };
  };

  let response: Response;
  try {
    response = await fetch(new URL(BATCH_PATH, origin.url), {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "warmgate-batch-version": String(BATCH_PROTOCOL_VERSION),
      },
      body: JSON.stringify(batch),
      signal: abort.signal,
    });
  } catch (error) {
    return failed("unavailable", `connect: ${describe(error)}`);
  }
  if (response.status !== 200 || response.body === null) {
    await response.body?.cancel().catch(() => {});
    // 503 is an origin saying it cannot take work (draining, overloaded).
    return failed(
      response.status === 503 ? "unavailable" : "bad_answer",
      `batch status ${response.status}`,
    );
  }
  if (!(response.headers.get("content-type") ?? "").startsWith(BATCH_CONTENT_TYPE)) {
    await response.body.cancel().catch(() => {});
    return failed("bad_answer", "batch answer is not framed");
  }
  if (!options.timeHead) clearTimeout(timer);

  const frames = readFrames(response.body);
  const nextFrame = async (): Promise<Frame | string> => {
    try {
      const step = await frames.next();
      return step.done ? "batch ended before the item's END" : step.value;
    } catch (error) {
      return describe(error);
    }
  };

  let head: ItemHead | undefined;
  while (head === undefined) {
    const frame = await nextFrame();
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

  let finished = false;
  const item: OpenItem = {
    head,
    async next() {
      if (finished) return { kind: "broken", detail: "item already finished" };
      for (;;) {
        const frame = await nextFrame();
        if (typeof frame === "string") {
          finished = true;
          return { kind: "broken", detail: frame };
        }
        switch (frame.type) {
          case FrameType.DATA:
            return { kind: "data", bytes: frame.payload };
          case FrameType.END:
            finished = true;
            return { kind: "end", trailer: decodeJsonPayload(frame.payload) as ItemTrailer };
          case FrameType.LOAD:
            options.onLoad?.(decodeJsonPayload(frame.payload) as LoadReport);
            break;
          case FrameType.HEAD:
            finished = true;
            return { kind: "broken", detail: "second HEAD for the item" };
        }
      }
    },
    cancel() {
      finished = true;
      abort.abort("client went away");
    },
  };
  return { kind: "open", item };
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
