/**
 * The Batcher's admitted callers by id (docs/batching.md, "Callers"): admission of a caller
 * with its sink and body, and every way a caller ends other than its item's END: timed out
 * or too large in its lane, failed before its HEAD, cancelled while waiting or running, or
 * given up by its caller.
 */
import { encodeJsonPayload } from "../../../contracts/protocol/framing.ts";
import type { LiveWindow } from "../live-window.ts";
import type {
  BatcherAttempt,
  BatcherCounters,
  BatcherFailureCode,
  BatcherFailureTrailer,
} from "../types.ts";
import { cancel as cancelInWindow } from "../window/events.ts";
import { assertNever } from "../window/state.ts";
import type { TickNotice } from "../window/types.ts";
import { type BatchCaller, type OpenCall, deliver, failBody, newCaller } from "./caller.ts";
import type { ClientBody } from "./client-body.ts";
import type { DeliveryMode } from "../../../contracts/delivery.ts";
import type { CallerSink } from "./sinks.ts";

/** What stops a running item on its origin (`upstream/stop.ts`). */
export interface RunningItemStopper {
  stop(caller: BatchCaller, call: OpenCall, mayCloseCall: boolean, askOrigin: boolean): void;
}

/** Every admitted caller that has not ended, by item id. */
export class Callers {
  readonly #byId = new Map<string, BatchCaller>();
  readonly #window: LiveWindow;
  readonly #counters: BatcherCounters;
  readonly #stopper: RunningItemStopper;

  constructor(window: LiveWindow, counters: BatcherCounters, stopper: RunningItemStopper) {
    this.#window = window;
    this.#counters = counters;
    this.#stopper = stopper;
  }

  get(id: string): BatchCaller | undefined {
    return this.#byId.get(id);
  }

  /** Registers an admitted caller. */
  admit(
    input: BatcherAttempt,
    delivery: DeliveryMode,
    sink: CallerSink,
    body: ClientBody | null,
  ): BatchCaller {
    const caller = newCaller(input, delivery, sink, body);
    this.#byId.set(input.id, caller);
    // The client went away: its usage so far is still billed, so the END must reach the caller.
    body?.closed.catch(() => {
      if (this.#byId.get(input.id) === caller) this.cancelUntilEnd(input.id);
    });
    return caller;
  }

  /** The caller has had its answer: it is forgotten. */
  ended(caller: BatchCaller): void {
    caller.stage = "ended";
    this.#byId.delete(caller.input.id);
    this.#window.router?.forget(caller.input.id);
  }

  /** The caller cancelled its item (its client went away); false when it had ended. */
  gone(id: string): boolean {
    const caller = this.#byId.get(id);
    if (caller === undefined) return false;
    const now = Date.now();
    const previous = caller.stage;
    this.ended(caller);
    caller.sink.close();
    // Aborted, never closed: a clean end would pass a cut answer off as a whole one.
    caller.body?.abort("item cancelled");
    caller.body = null;
    if (previous === "queued") {
      this.#window.update((s) => cancelInWindow(s, id, now).state);
      this.#counters.cancelledWaiting += 1;
      return true;
    }
    if (caller.call !== null && (previous === "sent" || previous === "open")) {
      if (!caller.cancelling) this.#counters.cancelledRunning += 1;
      this.#stopper.stop(caller, caller.call, true, !caller.cancelling);
    }
    return true;
  }

  /** Cancels a running item on its origin but keeps its stream open for its END. */
  cancelUntilEnd(id: string): boolean {
    const caller = this.#byId.get(id);
    if (caller === undefined) return false;
    if (caller.call === null || caller.stage === "queued") return this.gone(id);
    if (caller.cancelling) return true;
    caller.cancelling = true;
    this.#counters.cancelledRunning += 1;
    // Never by closing the call: the END with the item's usage must still come through it.
    this.#stopper.stop(caller, caller.call, false, true);
    return true;
  }

  /**
   * Ends a running item's body with a timeout error event, as its caller gave up on it
   * (`cancel` with `timedOut`); the item itself is cancelled by the caller's `cancel`.
   */
  timedOut(id: string): void {
    const caller = this.#byId.get(id);
    if (caller === undefined || caller.body === null || caller.stage !== "open") return;
    failBody(caller, true);
    caller.body.close();
    caller.body = null;
  }

  /** An item left its lane other than in a batch (see the window's `tick`). */
  leftLane(notice: TickNotice): void {
    const caller = this.#byId.get(notice.item.id);
    switch (notice.kind) {
      case "timed-out": {
        this.#counters.queueTimeouts += 1;
        const lane = this.#window.state?.config.lanes[notice.item.lane];
        if (caller === undefined) return;
        this.fail(caller, "queue_timeout", "The request waited too long for capacity.", {
          status: lane?.refuseStatus ?? 503,
          retry_after_ms: notice.retryAfterMs,
        });
        return;
      }
      case "too-large":
        if (caller === undefined) return;
        this.fail(caller, "prompt_too_large", "The prompt exceeds every origin's KV cache.");
        return;
      case "no-origin":
        this.#counters.queuedNoOrigin += 1;
        if (caller === undefined) return;
        this.fail(
          caller,
          "no_healthy_origin",
          "No origin of this region may take the request now.",
        );
        return;
      case "overdue":
        // A `wait` lane keeps it queued; the caller's own deadline still applies at the edge.
        return;
      default:
        assertNever(notice);
    }
  }

  /** An item that had left the queue failed before its HEAD (`how`: see the trailer). */
  failSent(
    caller: BatchCaller,
    code: BatcherFailureCode,
    detail: string,
    originId: string,
    how: Pick<BatcherFailureTrailer, "unreachable" | "busy" | "status" | "retry_after_ms"> = {},
  ): void {
    this.#counters.failedBeforeHead += 1;
    this.fail(caller, code, detail, { origin: originId, ...how });
  }

  /** Ends a caller with a lone END saying why its item never started. */
  fail(
    caller: BatchCaller,
    code: BatcherFailureCode,
    message: string,
    extra: Pick<
      BatcherFailureTrailer,
      "origin" | "status" | "retry_after_ms" | "unreachable" | "busy"
    > = {},
  ): void {
    if (caller.stage === "ended") return;
    this.ended(caller);
    const trailer: BatcherFailureTrailer = {
      id: caller.input.id,
      outcome: code === "queue_timeout" || code === "origin_timeout" ? "timeout" : "error",
      usage: null,
      error: { message, type: "server_error", code },
      ...extra,
    };
    caller.sink.end(encodeJsonPayload(trailer));
    // A body stream had no bytes yet: aborted, never closed (the caller answers from the END).
    caller.body?.abort("item failed before its HEAD");
    caller.body = null;
    deliver(caller);
  }
}
