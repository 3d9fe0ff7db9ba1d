/**
 * The upstream client of the batch protocol (origin/PROTOCOL.md), shared by the edge's
 * unbatched path and the Batcher: post a batch, cancel items, tell whether an answer is a
 * framed batch, and read its frames. The origin's access token is passed in, never read
 * from a global.
 */
import { type CredentialRing, credentialRefused } from "./credentials.ts";
import { type OnTimeClock, onTimeClock } from "./on-time.ts";
import type { OriginFailureKind } from "./errors.ts";
import {
  BATCH_CANCEL_PATH,
  BATCH_PATH,
  BATCH_PROTOCOL_VERSION,
  type BatchRequest,
  type CancelRequest,
  OUTCOMES_PATH,
  type OutcomesRequest,
  requestIdOf,
} from "./protocol/schema.ts";
import { BATCH_CONTENT_TYPE, type Frame, FrameDecoder, FrameType } from "./protocol/framing.ts";
import { encodeEnvelope } from "./protocol/envelope.ts";

/** Where an origin listens, and the bearer token it requires (none on open loopback). */
export interface UpstreamOrigin {
  url: string;
  token?: string | undefined;
}

/**
 * Posts a batch envelope to an origin's batch endpoint (one item's body after it, as the
 * client sent it); rejects only when the call fails.
 */
export function postBatch(
  origin: UpstreamOrigin,
  batch: BatchRequest,
  signal: AbortSignal,
): Promise<Response> {
  const { contentType, body } = encodeEnvelope(batch);
  return fetch(batchUrl(origin.url), {
    method: "POST",
    headers: originHeaders(origin, {
      "content-type": contentType,
      "warmgate-batch-version": String(BATCH_PROTOCOL_VERSION),
    }),
    body,
    signal,
  });
}

// Each origin's batch URL, resolved once: `new URL` is a call into the runtime, about 0.05 ms
// a request under workerd. Origins come from the configuration, so the map stays small.
const batchUrls = new Map<string, string>();

function batchUrl(originUrl: string): string {
  let url = batchUrls.get(originUrl);
  if (url === undefined) {
    url = new URL(BATCH_PATH, originUrl).href;
    if (batchUrls.size >= 256) batchUrls.clear();
    batchUrls.set(originUrl, url);
  }
  return url;
}

/** An origin with its credentials, and the ring that says which one it is on. */
export interface CredentialedOrigin {
  id: string;
  url: string;
  credentials: readonly string[];
  ring: CredentialRing;
}

/** The origin as one call reaches it: its URL and its current credential. */
export function currentUpstream(origin: CredentialedOrigin): UpstreamOrigin {
  return { url: origin.url, token: origin.ring.current(origin.id, origin.credentials) };
}

/**
 * {@link postBatch} with the origin's credentials: an answer that refuses the credential
 * (401 or 429) moves the origin to its next one, which is tried at once; each credential is
 * tried at most once per call.
 */
export async function postBatchWithCredentials(
  origin: CredentialedOrigin,
  batch: BatchRequest,
  signal: AbortSignal,
): Promise<Response> {
  for (let tried = 1; ; tried++) {
    const upstream = currentUpstream(origin);
    const response = await postBatch(upstream, batch, signal);
    const another =
      credentialRefused(response.status) &&
      tried < origin.credentials.length &&
      origin.ring.refused(origin.id, origin.credentials, upstream.token);
    if (!another) return response;
    await response.body?.cancel().catch(() => {});
  }
}

/**
 * Headers for a call to an origin, with its access token (the edge's `ORIGIN_TOKEN`) as
 * bearer token when set: origins started with `--access-token` refuse calls without it.
 */
export function originHeaders(
  origin: UpstreamOrigin,
  headers: Record<string, string>,
): Record<string, string> {
  return origin.token ? { ...headers, authorization: `Bearer ${origin.token}` } : headers;
}

/**
 * Asks an origin to cancel items of a running batch (all unfinished ones when `ids` is
 * absent). Harmless when they already ended; resolves false when the origin did not answer.
 */
export async function cancelBatchItems(
  origin: UpstreamOrigin,
  batchId: string,
  ids?: readonly string[],
): Promise<boolean> {
  const body: CancelRequest = { batch_id: batchId, ...(ids !== undefined && { ids: [...ids] }) };
  try {
    const response = await fetch(new URL(BATCH_CANCEL_PATH, origin.url), {
      method: "POST",
      headers: originHeaders(origin, { "content-type": "application/json" }),
      body: JSON.stringify(body),
    });
    await response.body?.cancel();
    return response.ok;
  } catch {
    return false;
  }
}

/**
 * Whether an origin answers a lookup of item `itemId`'s outcome (`POST /v1/batch/outcomes`)
 * within `ms` of this thread's on-time: a raw body carries no heartbeat, so this is how the
 * edge tells an origin that froze. Any answer is an origin that is there.
 */
export async function originAnswers(
  origin: UpstreamOrigin,
  itemId: string,
  ms: number,
): Promise<boolean> {
  const abort = new AbortController();
  const timer = onTimeClock(ms).timeout(ms, () => abort.abort("no answer"));
  const body: OutcomesRequest = { ids: [requestIdOf(itemId)] };
  try {
    const response = await fetch(new URL(OUTCOMES_PATH, origin.url), {
      method: "POST",
      headers: originHeaders(origin, { "content-type": "application/json" }),
      body: JSON.stringify(body),
      signal: abort.signal,
    });
    await response.body?.cancel().catch(() => {});
    return true;
  } catch {
    return false;
  } finally {
    timer.stop();
  }
}

/** Why a batch response cannot be read as frames, or null when it can. */
export function batchAnswerProblem(
  response: Response,
): { failure: OriginFailureKind; detail: string } | null {
  if (response.status !== 200 || response.body === null) {
    // 503 is an origin saying it cannot take work (draining, overloaded).
    return {
      failure: response.status === 503 ? "unavailable" : "bad_answer",
      detail: `batch status ${response.status}`,
    };
  }
  // A raw answer's type begins with the framed one's.
  if (!(response.headers.get("content-type") ?? "").startsWith(BATCH_CONTENT_TYPE)) {
    return { failure: "bad_answer", detail: "batch answer is not framed" };
  }
  return null;
}

/** Reads frames one at a time from a framed body; a string says why reading stopped. */
export interface FrameReader {
  /** The next frame, or why there is none (end of body, broken connection, bad framing). */
  next(): Promise<Frame | string>;
  /**
   * The payload of the next frame if it has already arrived (read with an earlier one)
   * and is a DATA frame, taken; otherwise undefined, and nothing is taken.
   */
  takeReadyData(): Uint8Array | undefined;
  /** Stops reading and cancels the body (the sender learns the reader went away). */
  cancel(): void;
}

/**
 * A {@link FrameReader} over a framed body (a batch response or a batcher item stream);
 * `onRead` hears of every chunk read (a watchdog's heartbeat).
 */
export function frameReader(body: ReadableStream<Uint8Array>, onRead?: () => void): FrameReader {
  return framesOf(body, false, onRead);
}

/** A {@link FrameReader} of a raw answer's frames, up to its HEAD; then its body, unframed. */
export interface RawFrameReader extends FrameReader {
  /**
   * Once the HEAD was read: the body's bytes that came with it, and the body to read on
   * (no longer locked by this reader). Call once; `next` is not called again.
   */
  rawBody(): { first: Uint8Array; body: ReadableStream<Uint8Array> };
}

/** A {@link RawFrameReader} over a raw batch answer (see `RAW_BATCH_CONTENT_TYPE`). */
export function rawFrameReader(
  body: ReadableStream<Uint8Array>,
  onRead?: () => void,
): RawFrameReader {
  return framesOf(body, true, onRead);
}

function framesOf(
  body: ReadableStream<Uint8Array>,
  untilHead: boolean,
  onRead?: () => void,
): RawFrameReader {
  const reader = body.getReader();
  const decoder = new FrameDecoder();
  // Frames decoded from the last chunk read; `at` is the next one to hand out.
  let ready: Frame[] = [];
  let at = 0;
  let stopped: string | null = null;
  let headRead = false;
  return {
    async next() {
      for (;;) {
        const frame = ready[at];
        if (frame !== undefined) {
          at++;
          return frame;
        }
        if (stopped !== null) return stopped;
        if (headRead) return "a raw answer has no frames after its HEAD";
        try {
          const { done, value } = await reader.read();
          if (done) {
            decoder.finish();
            stopped = "body ended before the item's END";
          } else {
            onRead?.();
            ready = decoder.push(value, untilHead);
            at = 0;
            headRead = untilHead && ready.at(-1)?.type === FrameType.HEAD;
          }
        } catch (error) {
          stopped = describe(error);
        }
      }
    },
    takeReadyData() {
      const frame = ready[at];
      if (frame?.type !== FrameType.DATA) return undefined;
      at++;
      return frame.payload;
    },
    cancel() {
      if (stopped === null) stopped = "reader cancelled";
      ready = [];
      at = 0;
      reader.cancel().catch(() => {});
    },
    rawBody() {
      reader.releaseLock();
      return { first: decoder.rest(), body };
    },
  };
}

/**
 * Reads a framed body whole, each frame decoded as its chunk comes and shown to `onFrame`
 * (a HEAD can stop a first-byte timer long before the item ends); `onRead` hears of every
 * chunk. A {@link FrameReader} over them; rejects on bad framing or a broken body.
 */
export async function readFrameList(
  body: ReadableStream<Uint8Array>,
  onRead: () => void,
  onFrame: (frame: Frame) => void,
): Promise<FrameReader> {
  const decoder = new FrameDecoder();
  const frames: Frame[] = [];
  const reader = body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    onRead();
    for (const frame of decoder.push(value)) {
      onFrame(frame);
      frames.push(frame);
    }
  }
  decoder.finish();
  let at = 0;
  let stopped: string | null = null;
  return {
    next() {
      const frame = frames[at];
      if (stopped === null && frame !== undefined) {
        at++;
        return Promise.resolve(frame);
      }
      return Promise.resolve(stopped ?? "body ended before the item's END");
    },
    takeReadyData() {
      const frame = frames[at];
      if (stopped !== null || frame?.type !== FrameType.DATA) return undefined;
      at++;
      return frame.payload;
    },
    cancel() {
      stopped ??= "reader cancelled";
    },
  };
}

/** A short description of a thrown value, for logs and failure details. */
export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

/**
 * Calls `silent` once no `beat` came for `silenceMs` of this thread's on-time (never when
 * that is not finite): an origin sends a LOAD frame every load interval while items run, so
 * a call silent that long while this thread kept time is an origin that froze; time this
 * thread spent stalled is not counted against it (see `on-time.ts`). `stop` ends the watch;
 * `clock` is the call's, when its other timers run on one.
 */
export function silenceWatchdog(
  silenceMs: number,
  silent: () => void,
  clock: OnTimeClock = onTimeClock(silenceMs),
) {
  const timer = clock.timeout(silenceMs, silent);
  return { beat: () => timer.reset(), stop: () => timer.stop() };
}
