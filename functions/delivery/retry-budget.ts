/**
 * The retry budget of an edge isolate (docs/failover.md, "Failover"): retries are at most a
 * share of requests plus a small floor over a sliding window, so a region's outage cannot
 * become a retry storm. Pure: time comes in as `now`.
 */

/** How many retries the budget allows. */
export interface RetryBudgetSettings {
  /** Retries as a share of requests. */
  ratio: number;
  /** Retries allowed however few requests there were. */
  floor: number;
  windowMs: number;
}

/** The window the edge counts retries over; the ratio and floor are `limits.retry_*`. */
export const RETRY_WINDOW_MS = 10_000;

/** Requests and retries of the last window, in one-second buckets. */
export class RetryBudget {
  readonly #buckets: { at: number; requests: number; retries: number }[] = [];

  /** Counts a request. */
  request(now: number): void {
    this.#bucket(now).requests += 1;
  }

  /** Takes a retry from the budget; false when the budget is spent (no retry then). */
  retry(now: number, settings: RetryBudgetSettings): boolean {
    let requests = 0;
    let retries = 0;
    for (const b of this.#live(now, settings.windowMs)) {
      requests += b.requests;
      retries += b.retries;
    }
    if (retries >= settings.floor + Math.floor(settings.ratio * requests)) return false;
    this.#bucket(now).retries += 1;
    return true;
  }

  #live(now: number, windowMs: number) {
    while (this.#buckets.length > 0 && (this.#buckets[0]?.at ?? now) <= now - windowMs) {
      this.#buckets.shift();
    }
    return this.#buckets;
  }

  #bucket(now: number) {
    const at = Math.floor(now / 1_000) * 1_000;
    const last = this.#buckets.at(-1);
    if (last !== undefined && last.at === at) return last;
    const fresh = { at, requests: 0, retries: 0 };
    this.#buckets.push(fresh);
    if (this.#buckets.length > 600) this.#buckets.shift();
    return fresh;
  }
}
