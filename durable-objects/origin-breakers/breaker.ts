/**
 * The circuit breaker of one origin as a pure state machine (docs/failover.md, "Breakers"):
 * closed → open on consecutive failures, a failure ratio over a sliding window, or a failure
 * where a reach check finds nothing there; open →
 * half-open once its cooldown (doubled each time live traffic trips it, capped) has passed;
 * half-open → closed after enough health probes in a row, or open again on a failed one.
 * Time comes in as `now`; nothing is mutated.
 */
import type { BreakerState, BreakerView, OutcomeReport } from "../../contracts/breaker.ts";
import type { BreakerSettings } from "../../contracts/config/breakers.ts";

/** One bucket of the sliding window. */
interface Bucket {
  at: number;
  requests: number;
  failures: number;
}

/** A breaker's whole state. */
export interface Breaker {
  region: string;
  origin: string;
  state: BreakerState;
  since: number;
  consecutive: number;
  buckets: Bucket[];
  openedCount: number;
  retryAt: number | null;
  /** Probes in a row that succeeded while half-open. */
  probeSuccesses: number;
  forced: boolean;
}

/** Buckets per window. */
const BUCKETS = 10;

export function newBreaker(region: string, origin: string, now: number): Breaker {
  return {
    region,
    origin,
    state: "closed",
    since: now,
    consecutive: 0,
    buckets: [],
    openedCount: 0,
    retryAt: null,
    probeSuccesses: 0,
    forced: false,
  };
}

/**
 * Takes in a reporter's outcomes; may open the breaker, but only when `room`: its region has
 * room under the ejection cap (see {@link ejectionRoom}).
 */
export function record(
  b: Breaker,
  report: OutcomeReport,
  now: number,
  s: BreakerSettings,
  room = true,
): Breaker {
  if (report.requests <= 0 && report.failures <= 0) return b;
  const bucketMs = s.windowMs / BUCKETS;
  const at = Math.floor(now / bucketMs) * bucketMs;
  const kept = b.buckets.filter((bucket) => bucket.at > now - s.windowMs);
  const last = kept.at(-1);
  const buckets =
    last !== undefined && last.at === at
      ? [
          ...kept.slice(0, -1),
          {
            at,
            requests: last.requests + report.requests,
            failures: last.failures + report.failures,
          },
        ]
      : [...kept, { at, requests: report.requests, failures: report.failures }];
  const succeeded = report.requests > report.failures;
  const consecutive = succeeded ? report.trailing : b.consecutive + report.failures;
  const next = { ...b, buckets, consecutive };
  if (b.state !== "closed" || b.forced) return next;
  const { requests, failures } = windowCounts(next, now, s);
  const ratioTrips = requests >= s.minRequests && failures / requests >= s.failureRatio;
  if (consecutive < s.consecutiveFailures && !ratioTrips) return next;
  if (!room) return next;
  const openedCount = b.openedCount + 1;
  return open(next, now, cooldownMs(openedCount, s), openedCount);
}

/** Whether a breaker is closed (not forced) with failures in a row counted against it. */
export function failing(b: Breaker): boolean {
  return b.state === "closed" && !b.forced && b.consecutive > 0;
}

/**
 * Whether a report leaves a closed breaker (not forced) with its origin's latest outcome a
 * failure: its object then checks whether the origin is there at all.
 */
export function failedLast(b: Breaker, report: OutcomeReport): boolean {
  return failing(b) && report.trailing > 0;
}

/**
 * A reach check found nothing where a closed breaker's origin just failed: it opens as a
 * trip by live traffic would (the failures are confirmed), unless a success has come in
 * since (no failures in a row left) or its region has no room.
 */
export function unreachable(b: Breaker, now: number, s: BreakerSettings, room = true): Breaker {
  if (!failing(b) || !room) return b;
  const openedCount = b.openedCount + 1;
  return open(b, now, cooldownMs(openedCount, s), openedCount);
}

/**
 * Whether one more of a region's breakers may open: at most `maxEjectionShare` of its
 * origins open or half-open at once, and at least one (Envoy's `max_ejection_percent`), so
 * that origins failing alike (a bad deploy, a burst of odd traffic) never empty a pool.
 */
export function ejectionRoom(breakers: readonly Breaker[], s: BreakerSettings): boolean {
  const shut = breakers.filter((b) => b.state !== "closed").length;
  return shut < Math.max(1, Math.floor(breakers.length * s.maxEjectionShare));
}

/**
 * Moves an open breaker whose cooldown has passed to half-open, and forgets the openings
 * of one that has stayed closed for the longest cooldown.
 */
export function tick(b: Breaker, now: number, s: BreakerSettings): Breaker {
  if (b.state === "closed") {
    const settled = b.openedCount > 0 && now - b.since >= s.maxCooldownMs;
    return settled ? { ...b, openedCount: 0 } : b;
  }
  if (b.state !== "open" || b.forced || b.retryAt === null || b.retryAt > now) return b;
  return { ...b, state: "half_open", since: now, probeSuccesses: 0 };
}

/**
 * A health probe of a half-open breaker's origin answered (`ok`) or failed. A failed one
 * opens it again for `cooldownMs`, its openings uncounted: an origin that is down is probed
 * at that pace (a probe is one token) and found within it once back, however long it was
 * down; only live traffic tripping it again after it closed doubles the cooldown.
 */
export function probed(b: Breaker, ok: boolean, now: number, s: BreakerSettings): Breaker {
  if (b.state !== "half_open" || b.forced) return b;
  if (!ok) return open(b, now, s.cooldownMs, b.openedCount);
  const probeSuccesses = b.probeSuccesses + 1;
  if (probeSuccesses < s.probes) return { ...b, probeSuccesses };
  return close(b, now);
}

/** An operator's choice: open until set otherwise, or closed (and trips again as usual). */
export function force(b: Breaker, state: "open" | "closed", now: number): Breaker {
  if (state === "open") {
    return { ...b, state: "open", since: now, retryAt: null, forced: true, probeSuccesses: 0 };
  }
  return { ...close(b, now), openedCount: 0, forced: false };
}

/** The breaker as the API shows it. */
export function viewOf(b: Breaker, now: number, s: BreakerSettings): BreakerView {
  const { requests, failures } = windowCounts(b, now, s);
  return {
    region: b.region,
    origin: b.origin,
    state: b.state,
    since: b.since,
    failures,
    requests,
    opened_count: b.openedCount,
    retry_at: b.state === "open" ? b.retryAt : null,
    forced: b.forced,
  };
}

/** The cooldown of the `n`th opening: `cooldownMs`, doubled each time, at most `maxCooldownMs`. */
export function cooldownMs(n: number, s: BreakerSettings): number {
  return Math.min(s.maxCooldownMs, s.cooldownMs * 2 ** Math.max(0, n - 1));
}

// Open for `waitMs`, with `openedCount` openings counted towards the next trip's cooldown.
function open(b: Breaker, now: number, waitMs: number, openedCount: number): Breaker {
  return { ...b, state: "open", since: now, openedCount, retryAt: now + waitMs, probeSuccesses: 0 };
}

function close(b: Breaker, now: number): Breaker {
  return {
    ...b,
    state: "closed",
    since: now,
    consecutive: 0,
    buckets: [],
    retryAt: null,
    probeSuccesses: 0,
  };
}

function windowCounts(b: Breaker, now: number, s: BreakerSettings) {
  let requests = 0;
  let failures = 0;
  for (const bucket of b.buckets) {
    if (bucket.at <= now - s.windowMs) continue;
    requests += bucket.requests;
    failures += bucket.failures;
  }
  return { requests, failures };
}
