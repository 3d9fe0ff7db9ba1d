/**
 * The unbatched path (docs/edge.md, "Delivery"): one request sent straight to an
 * origin as a batch of one over the batch protocol's upstream client, opened at its HEAD.
 */
import type { OriginConfig } from "../../contracts/config/regions.ts";
import type { OriginFailureKind } from "../../contracts/errors.ts";
import {
  BATCH_PROTOCOL_VERSION,
  type BatchRequest,
  type ItemHead,
  type ItemPath,
  type LoadReport,
} from "../../contracts/protocol/schema.ts";
import { FrameType, RAW_BATCH_CONTENT_TYPE } from "../../contracts/protocol/framing.ts";
import type { CredentialRing } from "../../contracts/credentials.ts";
import {
  type CredentialedOrigin,
  type FrameReader,
  type RawFrameReader,
  batchAnswerProblem,
  cancelBatchItems,
  currentUpstream,
  describe,
  readFrameList,
  frameReader,
  originAnswers,
  postBatchWithCredentials,
  rawFrameReader,
  silenceWatchdog,
} from "../../contracts/upstream.ts";
import { type OpenItem, frameItem, refusedItem } from "./item.ts";
import { rawItem } from "./raw-item.ts";
import { type OnTimeTimer, onTimeClock } from "../../contracts/on-time.ts";
import { LOST_ITEM, watchFirstByte, watchIdleEngine } from "../../contracts/origin-health.ts";
import type { DeliveryMode } from "../../contracts/delivery.ts";

/** The outcome of one attempt at an origin; `originId` names the origin that was tried. */
export type ItemAttempt = (
  | { kind: "open"; item: OpenItem; originId: string }
  | {
      kind: "failed";
      failure: OriginFailureKind;
      detail: string;
      /** The origin that failed, or null when none was reached (no healthy origin). */
      originId: string | null;
      /**
       * The item may have run although the attempt failed as `unavailable`: it was sent
       * before it was given up on (at `originId`, or at an origin of its region not named).
       */
      mayHaveRun?: boolean;
      /**
       * Its call could not reach the origin at all (the connection failed, not given up
       * on): an origin silent when asked later is down, its records with it.
       */
      unreachable?: true;
    }
) & {
  /** The upstream (a Batcher) already told the breakers how the attempt went. */
  reported?: boolean;
  /** It failed by time alone (silence, a first-byte timeout): a soft signal. */
  soft?: boolean;
  /** Its client went away before it opened: no verdict on its origin. */
  clientGone?: boolean;
};

/** What to send and how long to wait. */
export interface OpenItemOptions {
  requestId: string;
  /** The origin's credentials, in order of rotation (none for an open origin). */
  credentials: readonly string[];
  /** Which credential each origin is on, in this isolate. */
  ring: CredentialRing;
  path: ItemPath;
  body: string;
  headers: Record<string, string>;
  /** Give up when the origin has not answered within this many ms (its HEAD too, streamed). */
  firstByteTimeoutMs: number;
  /**
   * How the client gets the answer. Streamed: the first-byte timeout also covers the item's
   * HEAD, which engines send at once. Whole: an engine sends the HEAD with the complete
   * answer, so the first-byte timeout and the slow-HEAD rule count only the time the
   * origin's reports show its engine with no interactive work (`watchIdleEngine`).
   */
  delivery: DeliveryMode;
  /** Streamed, its body is piped raw (`raw-item.ts`); an origin may answer it framed. */
  piped: boolean;
  /** The origin gives up on the item after this many ms (outcome `timeout`). */
  itemTimeoutMs: number;
  /** Called with each load report the origin piggybacks on the response. */
  onLoad?: (report: LoadReport) => void;
  /**
   * Aborts when the client goes away: before the item's HEAD (or, answered whole, before its
   * END) the call is closed, which cancels the item on its origin; what it generated is
   * billed from the origin's outcome record, as for any attempt given up on.
   */
  clientSignal?: AbortSignal;
  /** Called once the attempt is under way, with a way to give it up before its HEAD. */
  onStart?: (giveUp: () => void) => void;
  /** Told once should the HEAD be late by `silenceMs` while the origin is idle. */
  onSlowHead?: () => void;
  /**
   * An origin sends its answer's headers at once and a LOAD frame every load interval while
   * the item runs: one silent this long is frozen, and the attempt fails.
   */
  silenceMs?: number;
}

/** Reason an attempt's abort carries when its first-byte timer fired. */
export const FIRST_BYTE_TIMEOUT = "first byte timeout";
/** Reason it carries when it was given up (its origin's breaker opened). */
const GIVEN_UP = "given up: the origin's circuit breaker opened";
/** Reason it carries when the origin went silent. */
const SILENT = "the origin went silent";
/** Reason it carries when its streamed HEAD was late while its origin queued nothing. */
const LOST = LOST_ITEM;
/** Reason it carries when its client went away before it opened. */
const CLIENT_GONE = "the client went away";

/** Posts a one-item batch to `origin` and waits for the item's HEAD. Never rejects. */
export async function openItem(
  origin: OriginConfig,
  options: OpenItemOptions,
): Promise<ItemAttempt> {
  if (options.clientSignal?.aborted === true) {
    // Gone before the call: nothing is sent, so nothing runs.
    return {
      kind: "failed",
      failure: "unavailable",
      detail: CLIENT_GONE,
      originId: null,
      clientGone: true,
    };
  }
  const credentialed: CredentialedOrigin = {
    id: origin.id,
    url: origin.url,
    credentials: options.credentials,
    ring: options.ring,
  };
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
    // A streamed body is piped to its client as it is (`raw-item.ts`).
    ...(options.piped && options.delivery === "stream" && { raw: true }),
  };
  const abort = new AbortController();
  const silenceMs = options.silenceMs ?? Number.POSITIVE_INFINITY;
  // Until the call's headers come, an origin silent for `silenceMs` is frozen; after them,
  // the silence watchdog judges that, and a streamed HEAD gets the whole first-byte timeout
  // (an origin queueing our work is busy, not sick). All count this thread's on-time only,
  // on one clock: the call's timers cost one runtime interval.
  const shortest = Math.min(options.firstByteTimeoutMs, silenceMs);
  const clock = onTimeClock(shortest);
  let timer = clock.timeout(shortest, () => abort.abort(FIRST_BYTE_TIMEOUT));
  options.onStart?.(() => abort.abort(GIVEN_UP));
  const client = options.clientSignal;
  const clientGone = () => abort.abort(CLIENT_GONE);
  client?.addEventListener("abort", clientGone, { once: true });
  const failed = (failure: OriginFailureKind, detail: string): ItemAttempt => {
    clock.stop();
    client?.removeEventListener("abort", clientGone);
    const reason: unknown = abort.signal.reason;
    abort.abort("attempt abandoned");
    const timedOut = reason === FIRST_BYTE_TIMEOUT || reason === SILENT || reason === LOST;
    return {
      kind: "failed",
      failure: reason === FIRST_BYTE_TIMEOUT || reason === LOST ? "timeout" : failure,
      detail,
      originId: origin.id,
      ...(timedOut && { soft: true }),
      ...(reason === CLIENT_GONE && { clientGone: true }),
      // Given up on by this edge (a breaker opened, a deadline): its call may have arrived.
      ...(reason !== undefined && { mayHaveRun: true }),
    };
  };

  let response: Response;
  try {
    response = await postBatchWithCredentials(credentialed, batch, abort.signal);
  } catch (error) {
    return failed("unavailable", `connect: ${describe(error)}`);
  }
  const problem = batchAnswerProblem(response);
  if (problem !== null || response.body === null) {
    // A call refused for overload (an origin at its connection cap) says what a busy HEAD says.
    const refusal = await refusedItem(options.requestId, response);
    if (refusal !== null) {
      clock.stop();
      client?.removeEventListener("abort", clientGone);
      return { kind: "open", item: refusal, originId: origin.id };
    }
    await response.body?.cancel().catch(() => {});
    return failed(problem?.failure ?? "bad_answer", problem?.detail ?? "no body");
  }
  const called = timer;
  let lastLoad: LoadReport | null = null;
  let slow: OnTimeTimer | null = null;
  if (options.delivery === "stream") {
    timer = clock.timeout(options.firstByteTimeoutMs, () => abort.abort(FIRST_BYTE_TIMEOUT));
    // A HEAD late while the origin's reports show no queue: it lost or hung our work, which
    // an engine would have answered at once. Judged slow, and tried elsewhere now.
    slow = watchFirstByte(
      silenceMs,
      () => lastLoad,
      () => {
        options.onSlowHead?.();
        abort.abort(LOST);
      },
      clock,
    );
  }
  // Every read is a heartbeat: an origin silent for `silenceMs` is frozen (see `SILENT`).
  const dog = silenceWatchdog(silenceMs, () => abort.abort(SILENT), clock);
  // Stopped after the timers that replace it, so that the clock's interval runs on.
  called.stop();
  abort.signal.addEventListener("abort", () => clock.stop(), { once: true });

  let frames: FrameReader;
  let raw: RawFrameReader | null = null;
  if (options.delivery === "whole") {
    // The origin ends the item by its own timeout; this only bounds a call that never ends.
    const stuck = setTimeout(() => abort.abort("item never ended"), options.itemTimeoutMs + 5_000);
    // Its HEAD comes with the whole answer: the origin's reports say whether it is worked on.
    const idle = watchIdleEngine(
      silenceMs,
      options.firstByteTimeoutMs,
      () => options.onSlowHead?.(),
      () => abort.abort(FIRST_BYTE_TIMEOUT),
    );
    try {
      frames = await readFrameList(response.body, dog.beat, (frame) => {
        if (frame.type === FrameType.LOAD) idle.report(frame.report);
        else if (frame.type === FrameType.HEAD) idle.stop();
      });
    } catch (error) {
      const silent = abort.signal.reason === SILENT;
      return failed(silent ? "timeout" : "bad_answer", `read: ${describe(error)}`);
    } finally {
      clearTimeout(stuck);
      idle.stop();
      dog.stop();
    }
  } else if ((response.headers.get("content-type") ?? "").startsWith(RAW_BATCH_CONTENT_TYPE)) {
    raw = rawFrameReader(response.body, dog.beat);
    frames = raw;
  } else {
    frames = frameReader(response.body, dog.beat);
  }
  let head: ItemHead | undefined;
  while (head === undefined) {
    const frame = await frames.next();
    if (typeof frame === "string") return failed("bad_answer", frame);
    switch (frame.type) {
      case FrameType.LOAD:
        lastLoad = frame.report;
        options.onLoad?.(lastLoad);
        break;
      case FrameType.HEAD:
        head = frame.head;
        break;
      case FrameType.END: {
        const { trailer } = frame;
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
  timer.stop();
  slow?.stop();
  // From here the response's lifecycle follows its client (`response.ts`).
  client?.removeEventListener("abort", clientGone);
  if (raw !== null) {
    // Its body carries no heartbeat: the item watches its origin by asking it.
    dog.stop();
    const { first, body } = raw.rawBody();
    const item = rawItem(head, first, body, {
      // For a batch of one, closing the call cancels the item on the origin.
      close: () => abort.abort("client went away"),
      answers: (ms) => originAnswers(currentUpstream(credentialed), options.requestId, ms),
      silenceMs,
    });
    return { kind: "open", item, originId: origin.id };
  }
  const item = frameItem(head, frames, {
    // For a batch of one, closing the call cancels the item on the origin.
    cancel: () => abort.abort("client went away"),
    cancelUntilEnd: () =>
      cancelBatchItems(currentUpstream(credentialed), options.requestId, [options.requestId]),
    onDone: dog.stop,
    ...(options.onLoad !== undefined && { onLoad: options.onLoad }),
  });
  return { kind: "open", item, originId: origin.id };
}
