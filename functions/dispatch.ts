/**
 * Sends a completion to an origin and streams its answer back unchanged.
 *
 * Each attempt goes through an {@link ItemOpener}: straight to the candidate origin as a
 * batch of one ({@link openDirect}), or through the region's `Batcher`, which picks the
 * origin itself (`functions/batcher-client.ts`); both answer with the same `OpenItem`.
 * Before the first byte reaches the client a failing origin is replaced by the next
 * candidate (within the retry budget), and origins that failed are avoided; after it, the
 * client's stream ends with an OpenAI error event, never as a silently truncated 200. A
 * JSON answer is read whole first, so an origin failing inside it answers 502/504.
 */
import type { LimitsConfig } from "./config.ts";
import {
  type ApiError,
  type OriginFailureKind,
  errorEvent,
  originFailure,
} from "../contracts/errors.ts";
import {
  type ItemAttempt,
  type ItemEvent,
  type OpenItem,
  type PipedBody,
  openItem,
} from "./origin-client.ts";
import type { OriginCandidate, OriginPool } from "./origin-pool.ts";
import {
  type ItemHead,
  type ItemPath,
  type ItemTrailer,
  concatBytes,
} from "../contracts/protocol.ts";
import type { SettledRequest } from "./settlement.ts";

/** One attempt at serving the request, as an opener receives it. */
export interface AttemptRequest {
  requestId: string;
  /** Item id for this attempt: the request id, suffixed for retries (unique per attempt). */
  attemptId: string;
  path: ItemPath;
  body: string;
  headers: Record<string, string>;
  firstByteTimeoutMs: number;
  /** Whether the first-byte timeout covers the item's HEAD (streaming answers). */
  timeHead: boolean;
  itemTimeoutMs: number;
  /** Origins that already failed this request. */
  avoidOrigins: readonly string[];
  /** The origins' access token (the edge's `ORIGIN_TOKEN`). */
  originToken?: string | undefined;
}

/** An attempt's outcome: an open item, a failure worth another candidate, or a final refusal. */
export type DispatchAttempt =
  | ItemAttempt
  /** Refused for a reason no other origin changes (a full queue): answered as it is. */
  | { kind: "refused"; error: ApiError };

/** Opens the request's item for one candidate; never rejects. */
export type ItemOpener = (
  candidate: OriginCandidate,
  request: AttemptRequest,
) => Promise<DispatchAttempt>;

/** The unbatched path: the candidate origin, a batch of one. */
export const openDirect: ItemOpener = (candidate, request) =>
  openItem(candidate.origin, {
    requestId: request.attemptId,
    originToken: request.originToken,
    path: request.path,
    body: request.body,
    headers: request.headers,
    firstByteTimeoutMs: request.firstByteTimeoutMs,
    timeHead: request.timeHead,
    itemTimeoutMs: request.itemTimeoutMs,
    // A JSON answer (no streaming asked) is read whole (see `respondWhole`).
    readWhole: !request.timeHead,
  });

/** Longest wait for a cancelled item's END (and its usage) after the client went away. */
export const CANCEL_USAGE_WAIT_MS = 5_000;

/** What the edge sends and how it reports the end. */
export interface DispatchOptions {
  requestId: string;
  path: ItemPath;
  /** The client's body text (with only the model alias replaced), forwarded as is. */
  body: string;
  /** The resolved model id. */
  model: string;
  /** Origins in the order to try them. */
  candidates: readonly OriginCandidate[];
  pool: OriginPool;
  limits: LimitsConfig;
  /** Whether the client asked for SSE (`stream: true`). */
  stream: boolean;
  /** Lower-case headers forwarded to the engine. */
  headers: Record<string, string>;
  /** The origins' access token (the edge's `ORIGIN_TOKEN`). */
  originToken?: string | undefined;
  /** Called exactly once when the request ends, however it ends. */
  onSettled: (settled: Omit<SettledRequest, "requestId">) => void;
  /** How each attempt reaches an origin (default {@link openDirect}). */
  open?: ItemOpener;
  /**
   * Aborts when the client disconnects (Workers' `request.signal`): how the edge learns it
   * for a body the upstream streams itself (see {@link PipedBody}).
   */
  signal?: AbortSignal;
  now?: () => number;
}

// Hop-by-hop headers (RFC 9110 §7.6.1) and framing the runtime sets for the client itself.
const DROPPED_HEADERS = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "proxy-connection",
  "content-length",
]);

/**
 * Tries candidates until one answers; returns the client's response, or throws the
 * {@link ApiError} (502/503/504, or an opener's refusal) of the last failure when none did.
 */
export async function dispatchCompletion(options: DispatchOptions): Promise<Response> {
  const now = options.now ?? Date.now;
  const open = options.open ?? openDirect;
  const attempts = Math.min(options.candidates.length, options.limits.retry_budget + 1);
  const avoid: string[] = [];
  let failure: OriginFailureKind = "unavailable";
  for (let i = 0; i < attempts; i++) {
    // A client that went away while an attempt waited wants no other origin tried.
    if (i > 0 && options.signal?.aborted === true) break;
    const candidate = options.candidates[i] as OriginCandidate;
    const planned = candidate.origin.id;
    const last = i === attempts - 1;
    options.pool.begin(planned);
    const attempt = await open(candidate, {
      requestId: options.requestId,
      attemptId: i === 0 ? options.requestId : `${options.requestId}.${i}`,
      path: options.path,
      body: options.body,
      headers: options.headers,
      firstByteTimeoutMs: options.limits.first_byte_timeout_ms,
      timeHead: options.stream,
      itemTimeoutMs: options.limits.request_timeout_ms,
      avoidOrigins: [...avoid],
      originToken: options.originToken,
    });
    options.pool.end(planned);
    if (attempt.kind === "refused") throw attempt.error;
    if (attempt.kind === "failed") {
      if (attempt.originId !== null) {
        options.pool.reportFailure(attempt.originId, now());
        avoid.push(attempt.originId);
      }
      failure = attempt.failure;
      console.warn("origin attempt failed", options.requestId, attempt.originId, attempt.detail);
      continue;
    }
    const originId = attempt.originId;
    const { status } = attempt.item.head;
    // 5xx means the engine failed; 429 means it is full: another origin may do better.
    // A last 429 goes to the client as it is, with the engine's retry-after.
    if (status >= 500 || (status === 429 && !last)) {
      attempt.item.cancel();
      avoid.push(originId);
      if (status >= 500) options.pool.reportFailure(originId, now());
      // The origin's own item timeout answers 504 (see origin/server.ts).
      failure = status === 504 ? "timeout" : "bad_answer";
      console.warn("origin answered", status, options.requestId, originId);
      continue;
    }
    options.pool.reportSuccess(originId);
    options.pool.begin(originId);
    return respond(attempt.item, candidate.region.id, originId, options);
  }
  const error: ApiError = originFailure(options.candidates.length === 0 ? "unavailable" : failure);
  throw error;
}

function respond(
  item: OpenItem,
  region: string,
  origin: string,
  options: DispatchOptions,
): Response | Promise<Response> {
  const { head } = item;
  if (!isEventStream(head)) return respondWhole(item, region, origin, options);
  if (item.piped !== undefined) return respondPiped(item, item.piped, region, origin, options);
  // No request may outlive its timeout, even if the origin stops sending without closing.
  const deadline = setTimeout(() => {
    finish("timeout", null, "request timeout");
    item.cancel();
  }, options.limits.request_timeout_ms);

  let finished = false;
  let clientGone = false;
  let streamController: ReadableStreamDefaultController<Uint8Array> | undefined;
  const finish = (
    outcome: SettledRequest["outcome"],
    trailer: ItemTrailer | null,
    detail?: string,
  ): void => {
    if (finished) return;
    finished = true;
    clearTimeout(deadline);
    options.pool.end(origin);
    const failedAfterHead = outcome !== "ok" && outcome !== "cancelled" && head.status < 400;
    if (failedAfterHead && streamController !== undefined) {
      console.warn("origin failed mid-stream", options.requestId, origin, detail ?? outcome);
      try {
        streamController.enqueue(
          errorEvent(originFailure(outcome === "timeout" ? "timeout" : "bad_answer")),
        );
        streamController.close();
      } catch {
        // The client already went away.
      }
    }
    settle(
      options,
      { region, origin, status: head.status, headStatus: head.status },
      outcome,
      trailer,
    );
  };

  const body = new ReadableStream<Uint8Array>(
    {
      start(controller) {
        streamController = controller;
      },
      async pull(controller) {
        for (;;) {
          const event: ItemEvent = await item.next();
          if (finished || clientGone) return;
          switch (event.kind) {
            case "data":
              if (event.bytes.byteLength === 0) continue;
              controller.enqueue(event.bytes);
              return;
            case "end": {
              const ended = endOutcome(event.trailer, head.status);
              if (ended.complete) {
                controller.close();
                finish(ended.outcome, event.trailer);
              } else {
                // The origin cancelled or timed out an item the client still wanted.
                finish(ended.outcome, event.trailer, event.trailer.error?.message);
              }
              return;
            }
            case "broken":
              finish("error", null, event.detail);
              return;
          }
        }
      },
      async cancel() {
        // The client went away: the item is cancelled on its origin, whose END still
        // reports the tokens generated until then, so the request is billed for them.
        clientGone = true;
        const trailer = await item.cancelForUsage(CANCEL_USAGE_WAIT_MS);
        finish("cancelled", trailer);
      },
    },
    // Pull only when the client reads: the origin's pace reaches the client without buffering.
    { highWaterMark: 0 },
  );

  return new Response(body, {
    status: head.status,
    headers: responseHeaders(head, region, origin),
  });
}

/**
 * A streamed answer whose body the upstream streams apart from its frames: the edge hands
 * the body over as it is and reads only the item's END, to settle the request. The upstream
 * writes the error event of a failure after the HEAD; the edge's own timeout asks it to.
 */
function respondPiped(
  item: OpenItem,
  piped: PipedBody,
  region: string,
  origin: string,
  options: DispatchOptions,
): Response {
  const { head } = item;
  let finished = false;
  let clientGone = false;
  let gaveUp: ReturnType<typeof setTimeout> | undefined;
  const finish = (outcome: SettledRequest["outcome"], trailer: ItemTrailer | null): void => {
    if (finished) return;
    finished = true;
    clearTimeout(deadline);
    if (gaveUp !== undefined) clearTimeout(gaveUp);
    options.signal?.removeEventListener("abort", gone);
    options.pool.end(origin);
    settle(
      options,
      { region, origin, status: head.status, headStatus: head.status },
      outcome,
      trailer,
    );
  };
  // No request may outlive its timeout, even if the origin stops sending without closing.
  const deadline = setTimeout(() => {
    piped.timeOut();
    finish("timeout", null);
  }, options.limits.request_timeout_ms);
  // The client went away: the item's END still reports the tokens generated until then.
  const gone = (): void => {
    clientGone = true;
    piped.clientGone();
    gaveUp = setTimeout(() => {
      finish("cancelled", null);
      item.cancel();
    }, CANCEL_USAGE_WAIT_MS);
  };
  if (options.signal?.aborted === true) gone();
  else options.signal?.addEventListener("abort", gone, { once: true });

  void (async () => {
    let event = await item.next();
    // A piped item has no DATA events; skip any rather than trust them.
    while (event.kind === "data") event = await item.next();
    if (event.kind === "broken") {
      if (!clientGone)
        console.warn("origin failed mid-stream", options.requestId, origin, event.detail);
      finish(clientGone ? "cancelled" : "error", null);
      return;
    }
    const { trailer } = event;
    // The upstream cancels the item when the client's body went away before this edge knew.
    if (clientGone || trailer.outcome === "cancelled") {
      finish("cancelled", trailer);
      return;
    }
    const ended = endOutcome(trailer, head.status);
    if (!ended.complete) {
      const detail = trailer.error?.message ?? trailer.outcome;
      console.warn("origin failed mid-stream", options.requestId, origin, detail);
    }
    finish(ended.outcome, trailer);
  })();

  return new Response(piped.body, {
    status: head.status,
    headers: responseHeaders(head, region, origin),
  });
}

/**
 * A JSON (non-SSE) answer, read whole before the client gets its headers: engines send it
 * at once when it is complete, and the edge puts the request's cost in a header, so there
 * is nothing to stream. An origin that fails before the END is an error answer (502/504),
 * never a truncated 200.
 */
async function respondWhole(
  item: OpenItem,
  region: string,
  origin: string,
  options: DispatchOptions,
): Promise<Response> {
  const { head } = item;
  let timedOut = false;
  const deadline = setTimeout(() => {
    timedOut = true;
    item.cancel();
  }, options.limits.request_timeout_ms);
  const chunks: Uint8Array[] = [];
  let ended: ItemEvent;
  try {
    if (item.piped !== undefined) {
      try {
        chunks.push(new Uint8Array(await new Response(item.piped.body).arrayBuffer()));
      } catch {
        // A body cut short: the END, or its absence, below says how the item ended.
      }
    }
    for (;;) {
      ended = await item.next();
      if (ended.kind !== "data") break;
      chunks.push(ended.bytes);
    }
  } finally {
    clearTimeout(deadline);
    options.pool.end(origin);
  }
  const trailer = ended.kind === "end" ? ended.trailer : null;
  const { complete, outcome: endedAs } =
    trailer === null
      ? { complete: false, outcome: "error" as const }
      : endOutcome(trailer, head.status);
  // Cut short: by the request's timeout, or because its client went away (the item was
  // cancelled on its origin, whose END still reports what it generated).
  const outcome: SettledRequest["outcome"] = complete
    ? endedAs
    : timedOut
      ? "timeout"
      : options.signal?.aborted === true
        ? "cancelled"
        : endedAs;
  const failure = complete ? null : originFailure(outcome === "timeout" ? "timeout" : "bad_answer");
  const served = {
    region,
    origin,
    status: failure?.status ?? head.status,
    headStatus: head.status,
  };
  settle(options, served, outcome, trailer);
  if (failure !== null) {
    const detail = ended.kind === "broken" ? ended.detail : trailer?.error?.message;
    console.warn("origin failed mid-response", options.requestId, origin, detail ?? outcome);
    throw failure;
  }
  return new Response(concatBytes(chunks), {
    status: head.status,
    headers: responseHeaders(head, region, origin),
  });
}

/** Reports the request's end once, with where it was served. */
function settle(
  options: DispatchOptions,
  served: { region: string; origin: string; status: number; headStatus: number },
  outcome: SettledRequest["outcome"],
  trailer: ItemTrailer | null,
): void {
  options.onSettled({
    model: options.model,
    outcome,
    usage: trailer?.usage ?? null,
    ...served,
    originBegan: served.headStatus < 400,
  });
}

/**
 * How an item whose END came ends for its client: complete when the engine finished it (or
 * answered with its own error, a 4xx, which is whole whatever its outcome says), otherwise
 * failed after its HEAD.
 */
function endOutcome(
  trailer: ItemTrailer,
  status: number,
): { complete: boolean; outcome: SettledRequest["outcome"] } {
  if (trailer.outcome === "ok") return { complete: true, outcome: "ok" };
  if (status >= 400) return { complete: true, outcome: "error" };
  return { complete: false, outcome: trailer.outcome === "timeout" ? "timeout" : "error" };
}

function responseHeaders(head: ItemHead, region: string, origin: string): Headers {
  const headers = new Headers();
  for (const [name, value] of Object.entries(head.headers)) {
    if (!DROPPED_HEADERS.has(name.toLowerCase())) headers.set(name, value);
  }
  headers.set("x-warmgate-region", region);
  headers.set("x-warmgate-origin", origin);
  return headers;
}

function isEventStream(head: ItemHead): boolean {
  for (const [name, value] of Object.entries(head.headers)) {
    if (name.toLowerCase() === "content-type") return value.startsWith("text/event-stream");
  }
  return false;
}
