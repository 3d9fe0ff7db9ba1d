/**
 * The one rule for an origin's health (docs/failover.md): what an answer says of its origin
 * ({@link judgeHead}), how long an origin that refused for overload is left alone
 * ({@link retryAfterMs}), and per isolate or Batcher which origins to try first
 * ({@link OriginHealth}): behind an open breaker never (except the bounded panic trickle),
 * busy or failed lately last, the rest first. Pure: time comes in as `now`.
 */

import { type OnTimeClock, type OnTimeTimer, onTimeClock } from "./on-time.ts";
import type { LoadReport } from "./protocol/schema.ts";

/** How long an origin that failed stays quarantined unless configured otherwise. */
export const DEFAULT_QUARANTINE_MS = 2_000;

/** While every origin of a model is behind an open breaker: one request per this, per isolate. */
export const PANIC_INTERVAL_MS = 1_000;

/** What the breakers say of an origin (see `breaker-cache.ts`). */
export interface BreakerGate {
  blocked(id: string): boolean;
  /** Whether an operator forced it open: then not even the panic trickle goes there. */
  forced?(id: string): boolean;
}

const NO_BREAKERS: BreakerGate = { blocked: () => false };

/**
 * What an item's HEAD says of its origin: it answered (`ok`, a 4xx included: the request's
 * doing); it is `busy` (429, or 503 with `retry-after`: overload, never counted against it);
 * or its engine failed the request (`error`, 5xx: the origin's fault only once another origin
 * answers the same request, see docs/failover.md).
 */
export function judgeHead(
  status: number,
  headers: Record<string, string>,
): "ok" | "busy" | "error" {
  if (status === 429) return "busy";
  if (status === 503 && headerOf(headers, "retry-after") !== undefined) return "busy";
  return status >= 500 ? "error" : "ok";
}

/** An answer's `retry-after` and `retry-after-ms` headers, those it has. */
export function retryAfterOf(response: Response): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const name of ["retry-after", "retry-after-ms"]) {
    const value = response.headers.get(name);
    if (value !== null) headers[name] = value;
  }
  return headers;
}

/** Whether a whole call's answer refuses it for overload, by the rule of {@link judgeHead}. */
export function refusedBusy(response: Response): boolean {
  return judgeHead(response.status, retryAfterOf(response)) === "busy";
}

/** How long a busy origin asks to be left alone, ms, from `retry-after-ms` or `retry-after`. */
export function retryAfterMs(headers: Record<string, string>): number {
  const ms = Number(headerOf(headers, "retry-after-ms"));
  if (Number.isFinite(ms) && ms > 0) return Math.min(ms, 60_000);
  const seconds = Number(headerOf(headers, "retry-after"));
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds * 1_000, 60_000) : 1_000;
}

/**
 * Whether a load report shows the origin working through a queue: a HEAD that is late
 * while it does is overload, not sickness (docs/failover.md, "Busy is not sick").
 */
export function reportsBusy(report: LoadReport | null): boolean {
  return report !== null && (report.waiting > 0 || report.running >= report.max_num_seqs);
}

/** What an item given up by the slow-first-byte rule failed with (see {@link watchFirstByte}). */
export const LOST_ITEM = "the origin lost the item: its HEAD is late and it queues nothing";

/**
 * The slow-first-byte rule, for a call or an attempt still waiting for a HEAD: after `ms`
 * of this thread's on-time, `onSlow` unless the origin's last report shows it queueing; on
 * `clock`, the call's, when its other timers run on one.
 */
export function watchFirstByte(
  ms: number,
  lastLoad: () => LoadReport | null,
  onSlow: () => void,
  clock: OnTimeClock = onTimeClock(ms),
): OnTimeTimer {
  return clock.timeout(ms, () => {
    if (!reportsBusy(lastLoad())) onSlow();
  });
}

/** Whether a load report shows its engine with no interactive work at all, run or queued. */
export function reportsIdle(report: LoadReport): boolean {
  return report.waiting === 0 && report.running - (report.background_running ?? 0) <= 0;
}

/** The watch of {@link watchIdleEngine}: fed each load report, stopped at the HEAD. */
export interface IdleEngineWatch {
  report(load: LoadReport): void;
  stop(): void;
}

/**
 * The slow-first-byte rule for answers read whole, whose HEAD an engine sends only once the
 * answer is complete: no clock tells a long answer from a lost one, the origin's reports do.
 * While they show its engine with no interactive work, run or queued, the work waiting on
 * it is not in the engine: after `slowMs` of that by the reports' own clock, `onSlow` and
 * `onGiveUp`, as a streamed HEAD late while its origin reports no queue is lost and tried
 * elsewhere ({@link watchFirstByte}); after `firstByteTimeoutMs` when that is shorter,
 * `onGiveUp` alone. A report with work starts the count again (docs/failover.md, "Busy is
 * not sick"): an answer its engine is generating is never cut for its length.
 */
export function watchIdleEngine(
  slowMs: number,
  firstByteTimeoutMs: number,
  onSlow: () => void,
  onGiveUp: () => void,
): IdleEngineWatch {
  const giveUpMs = Math.min(slowMs, firstByteTimeoutMs);
  let idleSince: number | null = null;
  let told = false;
  let done = false;
  return {
    report(load) {
      if (done) return;
      if (!reportsIdle(load)) {
        idleSince = null;
        return;
      }
      idleSince ??= load.t;
      const idleMs = load.t - idleSince;
      if (!told && idleMs >= slowMs) {
        told = true;
        onSlow();
      }
      if (idleMs >= giveUpMs) {
        done = true;
        onGiveUp();
      }
    },
    stop() {
      done = true;
    },
  };
}

function headerOf(headers: Record<string, string>, name: string): string | undefined {
  return Object.entries(headers).find(([key]) => key.toLowerCase() === name)?.[1];
}

/** Quarantine, busy and breaker state of a set of origins, by id. */
export class OriginHealth {
  readonly #until = new Map<string, number>();
  // Of those, the origins that refused for overload, and until when.
  readonly #busyUntil = new Map<string, number>();
  readonly quarantineMs: number;
  readonly #breakers: BreakerGate;
  #panicAt = Number.NEGATIVE_INFINITY;
  #panicTurn = 0;

  constructor(quarantineMs: number = DEFAULT_QUARANTINE_MS, breakers: BreakerGate = NO_BREAKERS) {
    this.quarantineMs = quarantineMs;
    this.#breakers = breakers;
  }

  /** Whether the origin may take client requests at all: its breaker lets them through. */
  usable(id: string): boolean {
    return !this.#breakers.blocked(id);
  }

  /**
   * The origin failed a request: it could not be reached, went silent, or broke off. It is
   * quarantined for `quarantineMs` (this rule's, unless given).
   */
  failed(id: string, now: number, quarantineMs: number = this.quarantineMs): void {
    this.#until.set(id, now + quarantineMs);
  }

  /** The origin refused for overload: tried last until its `retry-after` ends. */
  busy(id: string, now: number, headers: Record<string, string>): void {
    const until = now + retryAfterMs(headers);
    this.#until.set(id, Math.max(this.#until.get(id) ?? 0, until));
    this.#busyUntil.set(id, Math.max(this.#busyUntil.get(id) ?? 0, until));
  }

  /** Whether the origin refused for overload and its `retry-after` has not ended at `now`. */
  busyAt(id: string, now: number): boolean {
    return (this.#busyUntil.get(id) ?? Number.NEGATIVE_INFINITY) > now;
  }

  /** The origin answered: healthy again. */
  answered(id: string): void {
    this.#until.delete(id);
    this.#busyUntil.delete(id);
  }

  /** Whether the origin is quarantined or busy at `now`. */
  quarantined(id: string, now: number): boolean {
    return (this.#until.get(id) ?? Number.NEGATIVE_INFINITY) > now;
  }

  /**
   * The usable `items`, healthy first, then quarantined; each group keeps its order. Those
   * whose breaker blocks them are left out.
   */
  rank<T>(items: readonly T[], idOf: (item: T) => string, now: number): T[] {
    const healthy: T[] = [];
    const quarantined: T[] = [];
    for (const item of items) {
      const id = idOf(item);
      if (!this.usable(id)) continue;
      (this.quarantined(id, now) ? quarantined : healthy).push(item);
    }
    return healthy.concat(quarantined);
  }

  /**
   * Envoy's panic mode, bounded: when every origin of a model is behind an open breaker,
   * one of `items` in turn at most every {@link PANIC_INTERVAL_MS}, else none (the request
   * is refused with `retry-after`); never one an operator forced open. Probes go on
   * meanwhile; this only keeps a trickle flowing.
   */
  panic<T>(items: readonly T[], idOf: (item: T) => string, now: number): T | null {
    const open = items.filter((item) => this.#breakers.forced?.(idOf(item)) !== true);
    if (open.length === 0 || now - this.#panicAt < PANIC_INTERVAL_MS) return null;
    this.#panicAt = now;
    return open[this.#panicTurn++ % open.length] ?? null;
  }

  /** Forgets every failure. */
  clear(): void {
    this.#until.clear();
    this.#busyUntil.clear();
  }
}
