/**
 * The Batcher's upstream calls (docs/batching.md, "Upstream calls"): flushing the window on
 * time, sending each flushed batch to its origin (its frames go to `demux.ts`), giving up on
 * an origin whose breaker opened, and ending every item of a call that failed or broke off.
 * Each failure and answer is reported to the origins' health.
 */
import type { BreakerView, Verdict } from "../../../contracts/breaker.ts";
import { DEFAULT_BREAKER_CACHE } from "../../../contracts/breaker-cache.ts";
import { logWarn } from "../../../contracts/log.ts";
import { onTimeClock } from "../../../contracts/on-time.ts";
import {
  LOST_ITEM,
  retryAfterMs,
  watchFirstByte,
  watchIdleEngine,
} from "../../../contracts/origin-health.ts";
import { type BatchCaller, type OpenCall, deliver, failBody } from "../callers/caller.ts";
import type { Callers } from "../callers/callers.ts";
import { countBatch, countQueueWait } from "../counters.ts";
import type { KeepAlive } from "../keep-alive.ts";
import type { LiveWindow } from "../live-window.ts";
import type { CallRecords } from "../records.ts";
import {
  type BatcherCounters,
  type BatcherFailureCode,
  type BatchRecord,
  RECENT_BATCHES,
} from "../types.ts";
import { onItemDone } from "../window/events.ts";
import { assertNever } from "../window/state.ts";
import { recordThreadLag } from "../window/terms.ts";
import type { Batch } from "../window/types.ts";
import type { RegionBreakers } from "./breakers.ts";
import { type BusyRefusal, type CallEvents, runCall } from "./call.ts";
import type { OriginCredentials } from "./credentials.ts";
import { type FrameTargets, deliverHeld, demultiplex } from "./demux.ts";
import type { ItemStopper } from "./stop.ts";

/** How often the copy of the breakers is looked at while requests wait: its refresh age. */
const BREAKER_WATCH_MS = DEFAULT_BREAKER_CACHE.refreshMs;

/** The cursor of a router that has seen none of an origin's block events. */
const FIRST_EVENT = { log: "", seq: 0 } as const;
/** What an item fails with when no HEAD came within its first-byte timeout. */
const LATE_HEAD = "no answer within the first-byte timeout";

/** What the calls work with; each is built before them (see `Batcher`). */
export interface CallsOptions {
  window: LiveWindow;
  callers: Callers;
  stopper: ItemStopper;
  credentials: OriginCredentials;
  /** Told one verdict per call of what it showed of its origin. */
  breakers: RegionBreakers;
  records: CallRecords;
  counters: BatcherCounters;
  keepAlive: KeepAlive;
}

/** The Batcher's open upstream calls, and the flushes that send them. */
export class Calls {
  readonly #open = new Map<string, OpenCall>();
  /** The open call that brings each origin's block events, by origin id. */
  readonly #eventCarriers = new Map<string, string>();
  readonly #window: LiveWindow;
  readonly #callers: Callers;
  readonly #stopper: ItemStopper;
  readonly #credentials: OriginCredentials;
  readonly #breakers: RegionBreakers;
  readonly #records: CallRecords;
  readonly #counters: BatcherCounters;
  readonly #keepAlive: KeepAlive;
  readonly #frameTargets: FrameTargets;
  /** Call ids must not collide with calls an earlier incarnation may still have running. */
  readonly #incarnation = crypto.randomUUID().slice(0, 8);
  #nextSeq = 1;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #timerAt: number | null = null;
  readonly recent: BatchRecord[] = [];

  constructor(options: CallsOptions) {
    this.#window = options.window;
    this.#callers = options.callers;
    this.#stopper = options.stopper;
    this.#credentials = options.credentials;
    this.#breakers = options.breakers;
    this.#records = options.records;
    this.#counters = options.counters;
    this.#keepAlive = options.keepAlive;
    this.#frameTargets = {
      window: options.window,
      callers: options.callers,
      counters: options.counters,
    };
  }

  get size(): number {
    return this.#open.size;
  }

  has(id: string): boolean {
    return this.#open.has(id);
  }

  /**
   * Sends what is due, ends what left its lane otherwise, and sets the timer for the next.
   * While anything waits, the copy of the breakers is kept as fresh as a busy one (a
   * breaker opened elsewhere leaves what waits for its origin with none: its change ticks
   * the window, which refuses them), so the timer comes at least that often.
   */
  flush(now: number): void {
    const setup = this.#window.setup;
    const watching = setup?.breakers.enabled === true;
    if (watching && this.#window.queued() > 0) this.#breakers.sync(setup, now);
    const result = this.#window.tick(now);
    if (result === null) return;
    for (const notice of result.notices) this.#callers.leftLane(notice);
    for (const batch of result.batches) this.send(batch, now);
    const watch = watching && this.#window.queued() > 0 ? now + BREAKER_WATCH_MS : Infinity;
    const wake = Math.min(result.nextWakeAt ?? Infinity, watch);
    if (wake !== Infinity) this.schedule(wake);
  }

  /** Flushes when anything waits: room was freed. */
  flushIfQueued(now: number): void {
    if (this.#window.queued() > 0) this.flush(now);
  }

  /** Flushes at `at` unless a flush is due sooner. */
  schedule(at: number): void {
    if (this.#timerAt !== null && this.#timerAt <= at) return;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timerAt = at;
    // A timer, not an alarm: windows are milliseconds and alarms are too coarse for them.
    this.#timer = setTimeout(
      () => {
        this.#timer = null;
        this.#timerAt = null;
        this.flush(Date.now());
      },
      Math.max(0, at - Date.now()),
    );
  }

  /** Sends a flushed batch to its origin. */
  send(batch: Batch, now: number): void {
    const window = this.#window;
    const counters = this.#counters;
    const origin = window.setup?.origins.find((o) => o.id === batch.originId);
    if (origin === undefined) throw new Error(`no URL for origin ${batch.originId}`);
    const members = batch.items.map((entry) => {
      const caller = this.#callers.get(entry.id);
      if (caller === undefined) throw new Error(`batched item ${entry.id} has no caller`);
      return caller;
    });
    const silenceMs = window.setup?.breakers.settings.slowFirstByteMs ?? Number.POSITIVE_INFINITY;
    const timed = members.filter((c) => c.delivery === "stream");
    const firstByteMs = Math.min(...members.map((c) => c.input.firstByteTimeoutMs));
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
      // Stepped for its shortest timer, none shorter than an item's first-byte timeout or
      // the origin's allowed silence.
      clock: onTimeClock(Math.min(firstByteMs, silenceMs)),
      headTimer: null,
      slowTimer: null,
      idleWatch: null,
      lastLoad: null,
    };
    for (const caller of members) {
      countQueueWait(counters, Math.max(0, now - caller.admittedAt));
      caller.stage = "sent";
      caller.call = call;
    }
    // A streamed HEAD may take the whole first-byte timeout: an origin that keeps reporting
    // while it queues our work is busy, not sick; a frozen one is found by the call's
    // silence (see `call.ts`). One on-time timer per call, not per item.
    if (timed.length > 0) {
      const timeoutMs = Math.max(...timed.map((c) => c.input.firstByteTimeoutMs));
      call.headTimer = call.clock.timeout(timeoutMs, () => {
        call.headTimer = null;
        for (const caller of timed) this.#giveUp(caller, "origin_timeout", LATE_HEAD);
      });
      // Late HEADs from an origin whose reports say it is idle: it lost or hung our work,
      // which is judged slow and given up, so that each caller tries elsewhere now.
      call.slowTimer = watchFirstByte(
        silenceMs,
        () => call.lastLoad,
        () => {
          const late = timed.filter((c) => c.stage === "sent");
          if (late.length === 0) return;
          this.#outcome(call.originId, "slow");
          for (const caller of late) this.#giveUp(caller, "origin_timeout", LOST_ITEM);
        },
        call.clock,
      );
    }
    // A whole answer's HEAD comes once it is complete: what times it is the origin's reports.
    const whole = members.filter((c) => c.delivery === "whole");
    if (whole.length > 0) {
      const waiting = () => whole.filter((c) => c.stage === "sent");
      call.idleWatch = watchIdleEngine(
        silenceMs,
        Math.max(...whole.map((c) => c.input.firstByteTimeoutMs)),
        () => {
          if (waiting().length > 0) this.#outcome(call.originId, "slow");
        },
        () => {
          for (const caller of waiting()) this.#giveUp(caller, "origin_timeout", LATE_HEAD);
        },
      );
    }
    this.#open.set(call.id, call);
    window.sent(origin.id, now);
    countBatch(counters, batch.reason, members.length);
    const items = members.map((c) => c.input.id);
    this.recent.push({ batchId: call.id, originId: origin.id, reason: batch.reason, items });
    if (this.recent.length > RECENT_BATCHES) this.recent.shift();
    this.#records.opened(call, now, items);
    this.#keepAlive.armAlarm();
    const lanes = {
      count: window.state?.config.lanes.length ?? 1,
      batch: window.state?.config.batchLane,
    };
    // With routing on, one open call per origin at a time asks for the origin's block
    // events since those last seen: concurrent calls would each bring the same ones.
    const router = window.router;
    const carries = router !== null && !this.#eventCarriers.has(origin.id);
    if (carries) this.#eventCarriers.set(origin.id, call.id);
    const kvEventsAfter = carries ? (router.cursor(origin.id) ?? FIRST_EVENT) : null;
    const upstream = this.#credentials.credentialed(window.setup, call.originId, call.url);
    const events: CallEvents = {
      frames: (frames) => {
        if (demultiplex(this.#frameTargets, call, frames)) this.flushIfQueued(Date.now());
      },
      paused: (lagMs, at) => {
        counters.readPauses += 1;
        window.update((s) => recordThreadLag(s, lagMs, at));
      },
      failed: (code, detail, blame, unreachable, refusal) =>
        this.#failed(call, code, detail, blame, unreachable, refusal),
      ended: (broken) => this.#ended(call, broken),
    };
    const running = runCall(call, upstream, lanes, silenceMs, events, kvEventsAfter);
    this.#keepAlive.waitUntil(running);
  }

  /** The call failed before any frame: every item fails before its HEAD. */
  #failed(
    call: OpenCall,
    code: BatcherFailureCode,
    detail: string,
    blame: Verdict | "busy" | null,
    unreachable = false,
    refusal?: BusyRefusal,
  ): void {
    const now = Date.now();
    logWarn("batch call failed", { batch: call.id, origin: call.originId, detail });
    // Refused busy, its items ran nothing: each caller hears the refusal as a HEAD would say it.
    const how = refusal
      ? {
          busy: true as const,
          status: refusal.status,
          retry_after_ms: retryAfterMs(refusal.headers),
        }
      : { ...(unreachable && { unreachable }) };
    for (const [index, caller] of call.callers.entries()) {
      this.#closeItem(call, index, now);
      if (caller.stage !== "sent") continue;
      this.#callers.failSent(caller, code, detail, call.originId, how);
    }
    // One call is one observation, however many items it carried.
    if (blame === "busy") this.#window.health.busy(call.originId, now, refusal?.headers ?? {});
    else if (blame !== null) {
      this.#window.health.failed(call.originId, now);
      this.#outcome(call.originId, blame);
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
          this.#callers.failSent(
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
          this.#callers.ended(caller);
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
      this.#window.health.failed(call.originId, now);
      // Answers cut after their HEAD are judged by the edge, which sees them end; items
      // that never had one are this call's to tell, once.
      if (beforeHead) {
        this.#outcome(call.originId, call.abortReason === "silent" ? "slow" : "failed");
      }
    }
    this.#forget(call, now);
  }

  #closeItem(call: OpenCall, index: number, now: number): void {
    if (call.done.has(index)) return;
    call.done.add(index);
    const caller = call.callers[index];
    if (caller === undefined) return;
    this.#window.update((s) => onItemDone(s, call.originId, caller.input.id, now).state);
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
    call.idleWatch?.stop();
    call.idleWatch = null;
    deliverHeld(call);
    this.#records.closed(call.id);
    this.flushIfQueued(now);
  }

  /**
   * Breakers that changed (see `RegionBreakers.listen`): an origin that closed may take what
   * waits, and one now blocked is given up on.
   */
  breakersChanged(changed: readonly BreakerView[], now: number): void {
    const blocked = this.#window.blockedBy(changed);
    if (blocked === null) return;
    this.flushIfQueued(now);
    for (const origin of blocked) this.abandon(origin);
  }

  /**
   * Gives up on every item an origin has not begun to answer (its breaker opened): each
   * fails before its HEAD, so its caller tries elsewhere, and is stopped on the origin.
   */
  abandon(originId: string): void {
    for (const call of this.#open.values()) {
      if (call.originId !== originId) continue;
      for (const caller of call.callers) {
        this.#giveUp(caller, "origin_unavailable", "the origin's circuit breaker opened");
      }
    }
  }

  /** Stops an item not yet answered on its origin and fails it before its HEAD. */
  #giveUp(caller: BatchCaller, code: BatcherFailureCode, detail: string): void {
    const call = caller.call;
    if (caller.stage !== "sent" || call === null) return;
    this.#stopper.stop(caller, call, true, true);
    this.#callers.failSent(caller, code, detail, call.originId);
  }

  /** What a call showed of its origin, for its breaker (one verdict per call). */
  #outcome(originId: string, verdict: Verdict): void {
    this.#breakers.outcome(this.#window.setup, originId, verdict);
  }
}
