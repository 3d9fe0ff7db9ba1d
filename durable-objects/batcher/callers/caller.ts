/**
 * One admitted request attempt as the Batcher holds it (docs/batching.md, "Callers"), and
 * the upstream call it rides in. A caller moves queued → sent → open → ended; `ended` means
 * its caller has had its answer (or went away), and comes exactly once.
 */
import { errorEvent, originFailure } from "../../../contracts/errors.ts";
import type { ItemTrailer, LoadReport } from "../../../contracts/protocol/schema.ts";
import { encodeJsonPayload } from "../../../contracts/protocol/framing.ts";
import { AnswerSink, type CallerSink } from "./sinks.ts";
import type { ClientBody } from "./client-body.ts";
import type { BatcherAttempt } from "../types.ts";
import type { OnTimeClock, OnTimeTimer } from "../../../contracts/on-time.ts";
import type { DeliveryMode } from "../../../contracts/delivery.ts";
import type { IdleEngineWatch } from "../../../contracts/origin-health.ts";

export type CallerStage = "queued" | "sent" | "open" | "ended";

export interface BatchCaller {
  input: BatcherAttempt;
  delivery: DeliveryMode;
  stage: CallerStage;
  /** Where its HEAD, DATA and END go: the answers of `open` and `end`, or of `answer`. */
  sink: CallerSink;
  /** The client's response body, when it has a stream of its own (`open`). */
  body: ClientBody | null;
  call: OpenCall | null;
  /** The HEAD's status, once it came. */
  status: number | null;
  /** Cancelled on its origin while it waits for its END (`cancel` with `untilEnd`). */
  cancelling: boolean;
  /** When its first body byte came back (epoch ms), null before. */
  firstByteAt: number | null;
  /** When it was admitted (epoch ms): its wait in the queue counts from here. */
  admittedAt: number;
}

/** An upstream call to one origin, carrying one batch. */
export interface OpenCall {
  id: string;
  originId: string;
  url: string;
  /** By item index. */
  callers: BatchCaller[];
  /** Item indexes whose END arrived (or whose accounting was closed). */
  done: Set<number>;
  abort: AbortController;
  /** Why the call was aborted on purpose, if it was. */
  abortReason: "timeout" | "silent" | "all-cancelled" | null;
  /** When it was sent. */
  sentAt: number;
  /** Callers whose later tokens wait for {@link OpenCall.holdTimer} (see `tokenHoldMs`). */
  held: Set<BatchCaller>;
  holdTimer: ReturnType<typeof setTimeout> | null;
  /** The on-time clock its timers share: one runtime interval a call, not one a timer. */
  clock: OnTimeClock;
  /** Ends the streamed items still without a HEAD at their first-byte timeout. */
  headTimer: OnTimeTimer | null;
  /** Judges, once, streamed HEADs late past the breakers' `slowFirstByteMs`. */
  slowTimer: OnTimeTimer | null;
  /** For items answered whole: the time the origin's reports show its engine idle. */
  idleWatch: IdleEngineWatch | null;
  /** The last load report this call brought. */
  lastLoad: LoadReport | null;
}

/** A caller as admitted, before its item leaves the queue. */
export function newCaller(
  input: BatcherAttempt,
  delivery: DeliveryMode,
  sink: CallerSink,
  body: ClientBody | null,
): BatchCaller {
  return {
    input,
    delivery,
    stage: "queued",
    sink,
    body,
    call: null,
    status: null,
    cancelling: false,
    firstByteAt: null,
    admittedAt: Date.now(),
  };
}

/** Hands over what came since the last delivery; after the end, closes sink and body. */
export function deliver(caller: BatchCaller): void {
  const body = caller.body;
  body?.flush();
  caller.sink.flush();
  if (caller.stage !== "ended") return;
  caller.sink.close();
  if (body !== null) {
    body.close();
    caller.body = null;
  }
}

/**
 * Queues the SSE error event that ends the body of an item that failed after its HEAD. An
 * engine's own error answer (a 4xx) is whole as it is, and gets none.
 */
export function failBody(caller: BatchCaller, timedOut: boolean): void {
  if (caller.body === null || (caller.status ?? 0) >= 400) return;
  caller.body.push(errorEvent(originFailure(timedOut ? "timeout" : "bad_answer")));
}

/**
 * Answers an item's END: at once for a caller without a body of its own; for one with a
 * body, once its client has taken the whole body. A body its client left before the end is
 * not `ok` but `cancelled` (billed, as any cancel, for what was generated).
 */
export function answerEnd(caller: BatchCaller, payload: Uint8Array, trailer: ItemTrailer): void {
  const { sink, body } = caller;
  if (body === null || !(sink instanceof AnswerSink)) {
    sink.end(payload);
    return;
  }
  sink.endAfter(
    body.closed.then(
      () => payload,
      () =>
        trailer.outcome === "ok"
          ? encodeJsonPayload({ ...trailer, outcome: "cancelled" } satisfies ItemTrailer)
          : payload,
    ),
  );
}
