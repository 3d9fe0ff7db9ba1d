/**
 * Timers that count only the time this thread was on time (docs/failover.md, "Our lag is
 * not the origin's"). A Worker's thread that is busy with a burst fires its timers late, and
 * a plain timer would then blame an origin for the silence of our own stall. These tick in
 * small steps and credit each step at most twice its length, so a stall of seconds counts
 * as one step and the reader gets its turn before anything is judged.
 */

/** A timer that fires once `ms` of on-time have passed; `reset` starts the count again. */
export interface OnTimeTimer {
  reset(): void;
  stop(): void;
}

/** Calls `fire` once, after `ms` of this thread's on-time (never when `ms` is not finite). */
export function onTimeTimeout(ms: number, fire: () => void): OnTimeTimer {
  if (!Number.isFinite(ms)) return { reset() {}, stop() {} };
  const step = Math.max(10, Math.min(250, ms / 8));
  let last = Date.now();
  let credited = 0;
  const timer = setInterval(() => {
    const now = Date.now();
    credited += Math.min(now - last, 2 * step);
    last = now;
    if (credited < ms) return;
    clearInterval(timer);
    fire();
  }, step);
  return {
    reset() {
      credited = 0;
      last = Date.now();
    },
    stop() {
      clearInterval(timer);
    },
  };
}
