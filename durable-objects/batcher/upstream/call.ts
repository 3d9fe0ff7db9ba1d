/**
 * One upstream call of the Batcher (docs/batching.md, "Upstream calls"): the batch request
 * to an origin, the first-byte timer, and the reading of its framed answer, which gives way
 * to the rest of the object every {@link READ_TURN_MS}. What happens is told to `events`.
 */
import {
  BATCH_PROTOCOL_VERSION,
  type BatchRequest,
  type KvEventCursor,
} from "../../../contracts/protocol/schema.ts";
import { type Frame, FrameDecoder } from "../../../contracts/protocol/framing.ts";
import {
  type CredentialedOrigin,
  batchAnswerProblem,
  describe,
  postBatchWithCredentials,
  silenceWatchdog,
} from "../../../contracts/upstream.ts";
import type { OpenCall } from "../callers/caller.ts";
import type { BatcherFailureCode } from "../types.ts";
import type { Verdict } from "../../../contracts/breaker.ts";
import { refusedBusy, retryAfterOf } from "../../../contracts/origin-health.ts";
import { sleep } from "../../../contracts/sleep.ts";

/**
 * Longest stretch a call's reading keeps the Batcher's thread before it gives way to the
 * rest of its work.
 */
export const READ_TURN_MS = 10;

/** What a call tells its Batcher. */
export interface CallEvents {
  /** One origin chunk's frames. */
  frames(frames: readonly Frame[]): void;
  /** The reading gave way and got its turn back `lagMs` late, at `at`. */
  paused(lagMs: number, at: number): void;
  /**
   * The call failed before any frame; `blame` says what it shows of the origin (`slow` when
   * it was silent on a thread that kept time, `busy` when it refused for overload).
   */
  failed(
    code: BatcherFailureCode,
    detail: string,
    blame: Verdict | "busy" | null,
    unreachable?: boolean,
    /** A busy origin's refusal: its status and `retry-after` headers. */
    refusal?: BusyRefusal,
  ): void;
  /** The answer ended: cleanly (`broken` null) or broken off. */
  ended(broken: string | null): void;
}

/** A whole call refused for overload (429, or 503 with `retry-after`). */
export interface BusyRefusal {
  status: 429 | 503;
  headers: Record<string, string>;
}

/** How many lanes the window runs, and which of them is the batch lane (if any). */
export interface CallLanes {
  count: number;
  batch: number | undefined;
}

/** The batch request of `call`: its items with their priority, batch lines marked background. */
export function callEnvelope(
  call: Pick<OpenCall, "id" | "callers">,
  lanes: CallLanes,
  kvEventsAfter: KvEventCursor | null,
): BatchRequest {
  return {
    v: BATCH_PROTOCOL_VERSION,
    batch_id: call.id,
    items: call.callers.map(({ input }) => ({
      id: input.id,
      path: input.path,
      headers: input.headers,
      body: input.body,
      timeout_ms: input.itemTimeoutMs,
      // The protocol runs higher priorities first; lane 0 is the highest.
      priority: lanes.count - 1 - input.lane,
      // Batch lines wait at the origin for slots interactive requests leave (docs/batch-api.md).
      ...(input.lane === lanes.batch && { background: true }),
    })),
    ...(kvEventsAfter !== null && { kv_events_after: kvEventsAfter }),
  };
}

/** Runs `call` against `origin` until its answer ends; never rejects. */
export async function runCall(
  call: OpenCall,
  origin: CredentialedOrigin,
  lanes: CallLanes,
  silenceMs: number,
  events: CallEvents,
  kvEventsAfter: KvEventCursor | null = null,
): Promise<void> {
  const envelope = callEnvelope(call, lanes, kvEventsAfter);

  // An origin answers a call's headers and its first LOAD at once: one that does not within
  // `silenceMs` is frozen, whatever the items' own first-byte timeouts allow.
  const callTimeoutMs = Math.max(...call.callers.map((c) => c.input.firstByteTimeoutMs));
  const callTimer = call.clock.timeout(Math.min(callTimeoutMs, silenceMs), () => {
    call.abortReason = "timeout";
    call.abort.abort("first byte timeout");
  });
  let response: Response;
  try {
    response = await postBatchWithCredentials(origin, envelope, call.abort.signal);
  } catch (error) {
    callTimer.stop();
    if (call.abortReason === "all-cancelled") {
      events.ended(null);
      return;
    }
    const timedOut = call.abortReason === "timeout";
    events.failed(
      timedOut ? "origin_timeout" : "origin_unavailable",
      `connect: ${describe(error)}`,
      timedOut ? "slow" : "failed",
      // Not aborted: the connection itself failed.
      call.abortReason === null,
    );
    return;
  }
  callTimer.stop();
  const problem = batchAnswerProblem(response);
  if (problem !== null || response.body === null) {
    await response.body?.cancel().catch(() => {});
    // An origin that refuses a whole call for overload is busy, not sick.
    const busy = refusedBusy(response);
    events.failed(
      problem?.failure === "unavailable" ? "origin_unavailable" : "origin_error",
      problem?.detail ?? "no body",
      busy ? "busy" : "failed",
      false,
      busy
        ? { status: response.status === 429 ? 429 : 503, headers: retryAfterOf(response) }
        : undefined,
    );
    return;
  }

  const reader = response.body.getReader();
  const decoder = new FrameDecoder();
  let broken: string | null = null;
  // A call silent for `silenceMs` is an origin that froze mid-answer.
  const watchdog = silenceWatchdog(
    silenceMs,
    () => {
      call.abortReason = "silent";
      call.abort.abort("the origin went silent");
    },
    call.clock,
  );
  try {
    let turnStartedAt = Date.now();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      watchdog.beat();
      events.frames(decoder.push(value));
      // When the origin's answer is already buffered, each read is answered at once, and a
      // busy call could keep the thread through its whole answer while the streams it just
      // wrote to, other calls and new requests all wait. So the read gives way every
      // READ_TURN_MS, behind a zero-delay timer, and how late that timer fires is how
      // saturated the thread is, which the window's wait term weighs.
      const readAt = Date.now();
      if (readAt - turnStartedAt >= READ_TURN_MS) {
        await sleep(0);
        turnStartedAt = Date.now();
        events.paused(turnStartedAt - readAt, turnStartedAt);
      }
    }
    decoder.finish();
  } catch (error) {
    broken =
      call.abortReason === "all-cancelled"
        ? null
        : call.abortReason === "silent"
          ? `the origin sent nothing for ${silenceMs} ms`
          : describe(error);
  } finally {
    watchdog.stop();
  }
  events.ended(broken);
}
