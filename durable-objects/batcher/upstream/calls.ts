/**
 * The Batcher's upstream calls (docs/batching.md, "Upstream calls"): sending a flushed
 * batch (its frames go to `demux.ts`), stopping items, giving up on an origin whose breaker
 * opened, and ending every item of a call that failed or broke off. Each failure and answer
 * is reported to the origins' health.
 */
import { logWarn } from "../../../contracts/log.ts";
import {
  type CredentialedOrigin,
  cancelBatchItems,
  currentUpstream,
} from "../../../contracts/upstream.ts";
import {
  type BatchCaller,
  type OpenCall,
  assertNever,
  deliver,
  failBody,
} from "../callers/caller.ts";
import type { Callers } from "../callers/callers.ts";
import { countBatch, countQueueWait } from "../counters.ts";
import type { Queue } from "../live-window.ts";
import type { CallRecords } from "../records.ts";
import {
  type BatcherCounters,
  type BatcherFailureCode,
  type BatchRecord,
  RECENT_BATCHES,
} from "../types.ts";
import { deliverHeld, demultiplex } from "./demux.ts";
import { type CallEvents, runCall } from "./call.ts";
import type { Verdict } from "../../../contracts/breaker.ts";
import { onTimeTimeout } from "../../../contracts/on-time.ts";
import { watchFirstByte } from "../../../contracts/origin-health.ts";

/** The cursor of a router that has seen none of an origin's block events. */
const FIRST_EVENT = { log: "", seq: 0 } as const;
import { cancel as cancelInWindow, onItemDone } from "../window/events.ts";
import { recordThreadLag } from "../window/terms.ts";
import type { Batch } from "../window/types.ts";

/** What the calls need of their Batcher. */
export interface CallsHost {
  queue: Queue;
  callers: Callers;
  counters: BatcherCounters;
  records: CallRecords;
  /** Keeps the object alive for `work`. */
  waitUntil(work: Promise<unknown>): void;
  /** An origin as the upstream client calls it, with its credentials. */
  upstream(originId: string, url: string): CredentialedOrigin;
  armAlarm(): void;
  /** What a call showed of its origin, for its breaker (one verdict per call). */
  outcome(originId: string, verdict: Verdict): void;
}

export class Calls {
  readonly #open = new Map<string, OpenCall>();
  /** The open call that brings each origin's block events, by origin id. */
  readonly #eventCarriers = new Map<string, string>();
  readonly #host: CallsHost;
  /** Call ids must not collide with calls an earlier incarnation may still have running. */
  readonly #incarnation = crypto.randomUUID().slice(0, 8);
  #nextSeq = 1;
  readonly recent: BatchRecord[] = [];

  constructor(host: CallsHost) {
    this.#host = host;
  }

  get size(): number {
    return this.#open.size;
  }

  has(id: string): boolean {
    return this.#open.has(id);
  }

  /** Sends a flushed batch to its origin. */
  send(batch: Batch, now: number): void {
    const { queue, callers, counters, records } = this.#host;
    const origin = queue.setup?.origins.find((o) => o.id === batch.originId);
    if (origin === undefined) throw new Error(`no URL for origin ${batch.originId}`);
    const members = batch.items.map((entry) => {
      const caller = callers.get(entry.id);
      if (caller === undefined) throw new Error(`batched item ${entry.id} has no caller`);
      return caller;
    });
    const call: OpenCall = {
      id: `${this.#incarnation}-${this.#nextSeq++}`,
      originId: origin.id,
      url: origin.url,
      callers: members,
      done: new Set(),
      abort: new AbortController(),
      abortReason: null,
      sentAt: now,
      held: new Set(),
      holdTimer: null,
      headTimer: null,
      slowTimer: null,
      lastLoad: null,
    };
    for (const caller of members) {
      countQueueWait(counters, Math.max(0, now - caller.admittedAt));
      caller.stage = "sent";
      caller.call = call;
    }
    // A streamed HEAD may take the whole first-byte timeout: an origin that keeps reporting
    // while it queues our work is busy, not sick; a frozen one is found by the call's
    // silence (see `upstream-call.ts`). One on-time timer per call, not per item.
    const timed = members.filter((c) => c.input.timeHead);
    if (timed.length > 0) {
      const timeoutMs = Math.max(...timed.map((c) => c.input.firstByteTimeoutMs));
      call.headTimer = onTimeTimeout(timeoutMs, () => {
        call.headTimer = null;
        for (const caller of timed) this.#headTimeout(caller);
      });
      // Late HEADs from an origin whose reports say it is idle: it lost or hung our work.
      const slowMs = queue.setup?.breakers.settings.slowFirstByteMs ?? Number.POSITIVE_INFINITY;
      call.slowTimer = watchFirstByte(
        slowMs,
        () => call.lastLoad,
        () => {
          if (timed.some((c) => c.stage === "sent")) this.#host.outcome(call.originId, "slow");
        },
      );
    }
    this.#open.set(call.id, call);
    queue.sent(origin.id, now);
    countBatch(counters, batch.reason, members.length);
    const items = members.map((c) => c.input.id);
    this.recent.push({ batchId: call.id, originId: origin.id, reason: batch.reason, items });
    if (this.recent.length > RECENT_BATCHES) this.recent.shift();
    records.opened(call, now, items);
    this.#host.armAlarm();
    const lanes = queue.state?.config.lanes.length ?? 1;
    const silenceMs = queue.setup?.breakers.settings.slowFirstByteMs ?? Number.POSITIVE_INFINITY;
    // With routing on, one open call per origin at a time asks for the origin's block
    // events since those last seen: concurrent calls would each bring the same ones.
    const router = queue.router;
    const carries = router !== null && !this.#eventCarriers.has(origin.id);
    if (carries) this.#eventCarriers.set(origin.id, call.id);
    const kvEventsAfter = carries ? (router.cursor(origin.id) ?? FIRST_EVENT) : null;
    const upstream = this.#host.upstream(call.originId, call.url);
    const events: CallEvents = {
      frames: (frames) => demultiplex(this.#host, call, frames),
      paused: (lagMs, at) => {
        counters.readPauses += 1;
        queue.update((s) => recordThreadLag(s, lagMs, at));
      },
      failed: (code, detail, blame) => this.#failed(call, code, detail, blame),
      ended: (broken) => this.#ended(call, broken),
    };
    const running = runCall(call, upstream, lanes, silenceMs, events, kvEventsAfter);
    this.#host.waitUntil(running);
  }

  /**
   * Stops a running item on its origin. When nothing else in its call is still wanted,
   * closing the call does it (the origin cancels every unfinished item of a dropped call)
   * and saves a request; otherwise the origin's cancel endpoint stops just this item.
   */
  stop(caller: BatchCaller, call: OpenCall, mayCloseCall: boolean, askOrigin: boolean): void {
    const now = Date.now();
    this.#host.queue.update((s) => cancelInWindow(s, caller.input.id, now).state);
    const wanted = call.callers.some(
      (other, index) => other !== caller && !call.done.has(index) && other.stage !== "ended",
    );
    if (mayCloseCall && !wanted) {
      call.abortReason = "all-cancelled";
      call.abort.abort("every item was cancelled");
      return;
    }
    // Already asked (a cancel until END that the caller then stopped waiting for).
    if (!askOrigin) return;
    this.#host.waitUntil(
      cancelBatchItems(currentUpstream(this.#host.upstream(call.originId, call.url)), call.id, [
        caller.input.id,
      ]).then((ok) => {
        if (!ok) {
          logWarn("origin cancel failed", {
            batch: call.id,
            origin: call.originId,
            request_id: caller.input.id,
          });
        }
      }),
    );
  }

  /** The call failed before any frame: every item fails before its HEAD. */
  #failed(
    call: OpenCall,
    code: BatcherFailureCode,
    detail: string,
    blame: Verdict | "busy" | null,
  ): void {
    const now = Date.now();
    logWarn("batch call failed", { batch: call.id, origin: call.originId, detail });
    for (const [index, caller] of call.callers.entries()) {
      this.#closeItem(call, index, now);
      if (caller.stage !== "sent") continue;
      this.#host.callers.failSent(caller, code, detail, call.originId);
    }
    // One call is one observation, however many items it carried.
    if (blame === "busy") this.#host.queue.health.busy(call.originId, now, {});
    else if (blame !== null) {
      this.#host.queue.health.failed(call.originId, now);
      this.#host.outcome(call.originId, blame);
    }
    this.#forget(call, now);
  }

  /** The call's answer ended: items without an END end now (failed or cut off). */
  #ended(call: OpenCall, broken: string | null): void {
    const now = Date.now();
    let cut = false;
    let beforeHead = false;
    for (const [index, caller] of call.callers.entries()) {
      if (call.done.has(index)) continue;
      this.#closeItem(call, index, now);
      switch (caller.stage) {
        case "sent":
          cut = true;
          beforeHead = true;
          this.#host.callers.failSent(
            caller,
            "origin_error",
            broken ?? "batch ended early",
            call.originId,
          );
          break;
        case "open":
          // After HEAD the caller has bytes: an answer without END tells it the item was
          // cut, and a body of its own ends with the error event.
          cut = true;
          failBody(caller, false);
          this.#host.callers.ended(caller);
          deliver(caller);
          break;
        case "queued":
        case "ended":
          break;
        default:
          assertNever(caller.stage);
      }
    }
    if (cut && (call.abortReason === null || call.abortReason === "silent")) {
      logWarn("batch response cut", {
        batch: call.id,
        origin: call.originId,
        detail: broken ?? "no final frames",
      });
      this.#host.queue.health.failed(call.originId, now);
      // Answers cut after their HEAD are judged by the edge, which sees them end; items
      // that never had one are this call's to tell, once.
      if (beforeHead) {
        this.#host.outcome(call.originId, call.abortReason === "silent" ? "slow" : "failed");
      }
    }
    this.#forget(call, now);
  }

  #closeItem(call: OpenCall, index: number, now: number): void {
    if (call.done.has(index)) return;
    call.done.add(index);
    const caller = call.callers[index];
    if (caller === undefined) return;
    this.#host.queue.update((s) => onItemDone(s, call.originId, caller.input.id, now).state);
  }

  #forget(call: OpenCall, now: number): void {
    this.#open.delete(call.id);
    if (this.#eventCarriers.get(call.originId) === call.id)
      this.#eventCarriers.delete(call.originId);
    if (call.holdTimer !== null) clearTimeout(call.holdTimer);
    call.holdTimer = null;
    call.headTimer?.stop();
    call.headTimer = null;
    call.slowTimer?.stop();
    call.slowTimer = null;
    deliverHeld(call);
    this.#host.records.closed(call.id);
    this.#host.queue.flushIfQueued(now);
  }

  /**
   * Gives up on every item an origin has not begun to answer (its breaker opened): each
   * fails before its HEAD, so its caller tries elsewhere, and is stopped on the origin.
   */
  abandon(originId: string): void {
    for (const call of this.#open.values()) {
      if (call.originId !== originId) continue;
      for (const caller of call.callers) {
        if (caller.stage !== "sent") continue;
        this.stop(caller, call, true, true);
        this.#host.callers.failSent(
          caller,
          "origin_unavailable",
          "the origin's circuit breaker opened",
          originId,
        );
      }
    }
  }

  #headTimeout(caller: BatchCaller): void {
    const call = caller.call;
    if (caller.stage !== "sent" || call === null) return;
    this.stop(caller, call, true, true);
    this.#host.callers.failSent(
      caller,
      "origin_timeout",
      "no answer within the first-byte timeout",
      call.originId,
    );
  }
}
