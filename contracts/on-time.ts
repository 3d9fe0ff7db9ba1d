/**
 * Timers that count only the time this thread was on time (docs/failover.md, "Our lag is
 * not the origin's"). A Worker's thread that is busy with a burst fires its timers late, and
 * a plain timer would then blame an origin for the silence of our own stall. These tick in
 * small steps and credit each step at most twice its length, so a stall of seconds counts
 * as one step and the reader gets its turn before anything is judged. The timers of one
 * call share a clock: one runtime interval, whose creation and clearing cost per request.
 */

/** A timer that fires once `ms` of on-time have passed; `reset` starts the count again. */
export interface OnTimeTimer {
  reset(): void;
  stop(): void;
}

/** On-time timers that share one interval, which runs only while one of them does. */
export interface OnTimeClock {
  /** Calls `fire` once, after `ms` of on-time (never when `ms` is not finite). */
  timeout(ms: number, fire: () => void): OnTimeTimer;
  /** Stops every timer of the clock. */
  stop(): void;
}

interface Watch {
  ms: number;
  fire: () => void;
  credited: number;
  last: number;
}

const IDLE: OnTimeTimer = { reset() {}, stop() {} };

/**
 * A clock stepped for timers of `shortestMs` and longer (a step of an eighth of it, 10 to
 * 250 ms): a shorter one would be judged in steps too coarse for it.
 */
export function onTimeClock(shortestMs: number): OnTimeClock {
  const step = Number.isFinite(shortestMs) ? Math.max(10, Math.min(250, shortestMs / 8)) : 250;
  const running = new Set<Watch>();
  let interval: ReturnType<typeof setInterval> | undefined;
  const halt = (watch: Watch) => {
    running.delete(watch);
    if (running.size > 0 || interval === undefined) return;
    clearInterval(interval);
    interval = undefined;
  };
  const tick = () => {
    const now = Date.now();
    // A timer that fires may stop others: a Set's iteration skips what was deleted.
    for (const watch of running) {
      watch.credited += Math.min(now - watch.last, 2 * step);
      watch.last = now;
      if (watch.credited < watch.ms) continue;
      halt(watch);
      watch.fire();
    }
  };
  return {
    timeout(ms, fire) {
      if (!Number.isFinite(ms)) return IDLE;
      const watch: Watch = { ms, fire, credited: 0, last: Date.now() };
      running.add(watch);
      interval ??= setInterval(tick, step);
      return {
        reset() {
          watch.credited = 0;
          watch.last = Date.now();
        },
        stop: () => halt(watch),
      };
    },
    stop() {
      running.clear();
      if (interval !== undefined) clearInterval(interval);
      interval = undefined;
    },
  };
}

/** Calls `fire` once, after `ms` of this thread's on-time (never when `ms` is not finite). */
export function onTimeTimeout(ms: number, fire: () => void): OnTimeTimer {
  return onTimeClock(ms).timeout(ms, fire);
}
