/**
 * Handing each caller of an upstream call its own item's frames (docs/batching.md,
 * "Upstream calls"): HEAD, DATA and END as one origin chunk brings them, in one write per
 * caller; LOAD reports to the window. While the Batcher's thread lags, a streamed item's
 * later tokens are held for a share of that lag so that they leave together.
 */
import { type Frame, FrameType } from "../../../contracts/protocol/framing.ts";
import { judgeHead } from "../../../contracts/origin-health.ts";
import {
  type BatchCaller,
  type OpenCall,
  answerEnd,
  deliver,
  failBody,
} from "../callers/caller.ts";
import type { Callers } from "../callers/callers.ts";
import type { LiveWindow } from "../live-window.ts";
import type { BatcherCounters } from "../types.ts";
import { onDispatched, onItemDone, onItemsAcked, onOriginLoad } from "../window/events.ts";
import { recordThreadLag, tokenHoldMs } from "../window/terms.ts";

/** What a call's frames go to: the window, the callers, and the counter of holds. */
export interface FrameTargets {
  window: LiveWindow;
  callers: Callers;
  counters: BatcherCounters;
}

/**
 * Applies one origin chunk's frames; each caller gets its share in one write. True when the
 * chunk freed room on the origin (a LOAD report or an END): what waits may leave now.
 */
export function demultiplex(to: FrameTargets, call: OpenCall, frames: readonly Frame[]): boolean {
  if (frames.length === 0) return false;
  const { window, callers } = to;
  const now = Date.now();
  let freed = false;
  // Callers with frames of this chunk, each once.
  const touched = new Set<BatchCaller>();
  // Callers whose HEAD or first DATA came in this chunk: never held.
  const fresh = new Set<BatchCaller>();
  for (const frame of frames) {
    if (frame.type === FrameType.LOAD) {
      const { report } = frame;
      const first = call.lastLoad === null;
      call.lastLoad = report;
      call.idleWatch?.report(report);
      window.update((s) => onOriginLoad(s, call.originId, report, now).state);
      // An origin writes a call's first report before the call's items start (PROTOCOL.md):
      // the reports after it count them.
      if (first) window.update((s) => onItemsAcked(s, call.originId, idsOf(call), report.t));
      window.router?.report(call.originId, {
        kvTotalTokens: (report.kv_total_blocks ?? 0) * (report.block_size ?? 0),
        prefixQueries: report.prefix_queries ?? 0,
        at: report.t ?? 0,
      });
      if (report.kv_events !== undefined) window.router?.events(call.originId, report.kv_events);
      freed = true;
      continue;
    }
    const caller = call.callers[frame.item];
    if (caller === undefined) continue;
    switch (frame.type) {
      case FrameType.HEAD: {
        if (caller.stage !== "sent") break;
        caller.stage = "open";
        const { head } = frame;
        caller.status = head.status;
        // The edge judges a HEAD's status, as it alone sees the request on every origin it
        // tried; the window only learns whom to try first (docs/failover.md).
        switch (judgeHead(head.status, head.headers)) {
          case "busy":
            window.health.busy(call.originId, now, head.headers);
            break;
          case "ok":
            window.health.answered(call.originId);
            break;
          case "error":
            // Tried last for a while, whoever is to blame (a ranking, not a verdict).
            window.health.failed(call.originId, now);
            break;
        }
        touched.add(caller);
        fresh.add(caller);
        // The caller learns which origin serves it from an added `origin` field.
        caller.sink.head({ ...head, origin: call.originId });
        break;
      }
      case FrameType.DATA:
        if (caller.firstByteAt === null) {
          // The wait term of the window learns how long first bytes take. Edges that
          // report what their requests waited are counted by their reports, not twice.
          caller.firstByteAt = now;
          caller.sink.firstByte?.(now);
          fresh.add(caller);
          window.router?.started(caller.input.id);
          const countWait = caller.input.recentFirstByteMs === undefined;
          window.update(
            (s) => onDispatched(s, call.originId, caller.input.id, now, { countWait }).state,
          );
        }
        if (caller.stage !== "open") break;
        touched.add(caller);
        if (caller.body !== null) caller.body.push(frame.payload);
        else caller.sink.data(frame.payload);
        break;
      case FrameType.END: {
        if (call.done.has(frame.item)) break;
        call.done.add(frame.item);
        window.update((s) => onItemDone(s, call.originId, caller.input.id, now).state);
        freed = true;
        const { trailer } = frame;
        window.router?.ended(caller.input.id, trailer.usage);
        if (caller.stage === "open") {
          touched.add(caller);
          if (trailer.outcome !== "ok") failBody(caller, trailer.outcome === "timeout");
          // Cut by its origin after a good HEAD: tried last for a while. The edge, which
          // sees how every answer ends, tells the breaker.
          if (trailer.outcome === "error" && (caller.status ?? 0) < 400) {
            window.health.failed(call.originId, now);
          }
          answerEnd(caller, frame.payload, trailer);
          callers.ended(caller);
        } else if (caller.stage === "sent") {
          // Origins always answer a HEAD first; an END alone is a broken origin.
          callers.failSent(
            caller,
            trailer.outcome === "timeout" ? "origin_timeout" : "origin_error",
            `item ended before its HEAD: ${trailer.error?.message ?? trailer.outcome}`,
            call.originId,
          );
        }
        break;
      }
    }
  }
  // Written now, not from a zero-delay timer (which costs about as much as relaying a
  // frame). Only while this object's thread lags are a streamed item's later tokens held,
  // for a share of that lag, so that several engine steps leave in one write (see
  // `tokenHoldMs`); its HEAD, first token and END never wait.
  const holdMs = window.state === null ? 0 : tokenHoldMs(window.state, now);
  for (const caller of touched) {
    if (holdMs > 0 && caller.body !== null && caller.stage === "open" && !fresh.has(caller)) {
      call.held.add(caller);
      continue;
    }
    call.held.delete(caller);
    deliver(caller);
  }
  if (call.held.size > 0 && call.holdTimer === null) hold(to, call, holdMs, now);
  return freed;
}

/** Delivers the call's held callers in `holdMs`; how late that fires is the thread's lag. */
function hold(to: FrameTargets, call: OpenCall, holdMs: number, now: number): void {
  const due = now + holdMs;
  to.counters.holds += 1;
  call.holdTimer = setTimeout(() => {
    call.holdTimer = null;
    const firedAt = Date.now();
    to.window.update((s) => recordThreadLag(s, Math.max(0, firedAt - due), firedAt));
    deliverHeld(call);
  }, holdMs);
}

/** Delivers what a call held back. */
export function deliverHeld(call: OpenCall): void {
  const held = [...call.held];
  call.held.clear();
  for (const caller of held) deliver(caller);
}

function idsOf(call: OpenCall): Set<string> {
  return new Set(call.callers.map((caller) => caller.input.id));
}
