/**
 * A reporter's copy of its regions' breakers (docs/failover.md, "Breakers"), kept by every
 * edge isolate and every Batcher: no Durable Object call per request. Outcomes gather here
 * and go to the region's `OriginBreakers` in bulk: successes at most every `flushMs`, a
 * failure at once (or right behind the exchange in flight), and the answer brings every
 * breaker of the region back; a copy older than `refreshMs` (`shutRefreshMs` while one of
 * its breakers is open) is refreshed the same way.
 */
import type { BreakerRegion, BreakerView, OutcomeReport, Verdict } from "./breaker.ts";

/** Sends a region's outcomes and answers its breakers. */
export type BreakerExchange = (
  region: BreakerRegion,
  reports: OutcomeReport[],
) => Promise<BreakerView[]>;

export interface BreakerCacheOptions {
  refreshMs: number;
  /**
   * The refresh while any breaker of the region is open or half-open: a half-open one may
   * close at its next probe, and its origin should take requests again at once.
   */
  shutRefreshMs: number;
  flushMs: number;
  /** Told of every breaker whose state changed in a region's answer. */
  onChange?: (changed: BreakerView[]) => void;
}

export const DEFAULT_BREAKER_CACHE: Readonly<BreakerCacheOptions> = {
  refreshMs: 1_000,
  shutRefreshMs: 250,
  flushMs: 250,
};

interface Region {
  views: Map<string, BreakerView>;
  syncedAt: number;
  pending: Map<string, OutcomeReport>;
  sending: Promise<void> | null;
}

export class BreakerCache {
  readonly #exchange: BreakerExchange;
  readonly #options: BreakerCacheOptions;
  readonly #regions = new Map<string, Region>();

  constructor(exchange: BreakerExchange, options: Partial<BreakerCacheOptions> = {}) {
    this.#exchange = exchange;
    this.#options = { ...DEFAULT_BREAKER_CACHE, ...options };
  }

  /** The breaker of an origin as last heard; undefined before the first answer. */
  view(origin: string): BreakerView | undefined {
    for (const region of this.#regions.values()) {
      const view = region.views.get(origin);
      if (view !== undefined) return view;
    }
    return undefined;
  }

  /** Whether the origin's breaker keeps client requests away (open or half-open). */
  blocked(origin: string): boolean {
    const state = this.view(origin)?.state;
    return state === "open" || state === "half_open";
  }

  /** Whether an operator forced the origin's breaker (open or closed). */
  forced(origin: string): boolean {
    return this.view(origin)?.forced === true;
  }

  /** Counts one observation of an origin (see {@link Verdict}). */
  record(
    region: BreakerRegion,
    origin: string,
    verdict: Verdict,
    now: number,
  ): Promise<void> | null {
    const r = this.#region(region.id);
    const current = r.pending.get(origin) ?? {
      origin,
      requests: 0,
      failures: 0,
      trailing: 0,
    };
    const ok = verdict === "ok";
    r.pending.set(origin, {
      origin,
      requests: current.requests + 1,
      failures: current.failures + (ok ? 0 : 1),
      trailing: ok ? 0 : current.trailing + 1,
    });
    // Failures go at once: a trip must reach every reporter within a second.
    return this.sync(region, now, !ok);
  }

  /**
   * The copy brought up to date now, whatever its age: the exchange in flight, or a new one.
   * For a request about to be refused because every breaker it knows is open.
   */
  async refresh(region: BreakerRegion, now: number): Promise<void> {
    const r = this.#region(region.id);
    try {
      if (r.sending !== null) await r.sending;
      await (this.sync(region, now, true) ?? r.sending);
    } catch {
      // An object that cannot be reached leaves the copy as it was.
    }
  }

  /**
   * Sends what is pending and takes the answer, when due (at once when `urgent`: a failure
   * that may have opened a breaker); the promise to keep the sender alive for, or null when
   * nothing was due or an exchange is already in flight.
   */
  sync(region: BreakerRegion, now: number, urgent = false): Promise<void> | null {
    const r = this.#region(region.id);
    if (r.sending !== null) return null;
    const age = now - r.syncedAt;
    const shut = [...r.views.values()].some((view) => view.state !== "closed");
    const due =
      urgent ||
      age >= (shut ? this.#options.shutRefreshMs : this.#options.refreshMs) ||
      (r.pending.size > 0 && age >= this.#options.flushMs);
    if (!due) return null;
    const reports = [...r.pending.values()];
    r.pending.clear();
    r.syncedAt = now;
    r.sending = this.#exchange(region, reports)
      .then((views) => this.#take(r, views))
      .catch(() => {
        // Lost outcomes are few; the next sync carries on from here.
      })
      .then(() => {
        r.sending = null;
        // Failures that came while the exchange was in flight go right behind it.
        const failed = [...r.pending.values()].some((p) => p.failures > 0);
        return failed ? (this.sync(region, Date.now(), true) ?? undefined) : undefined;
      });
    return r.sending;
  }

  #take(r: Region, views: readonly BreakerView[]): void {
    const changed: BreakerView[] = [];
    for (const view of views) {
      const before = r.views.get(view.origin);
      if (before?.state !== view.state) changed.push(view);
      r.views.set(view.origin, view);
    }
    if (changed.length > 0) this.#options.onChange?.(changed);
  }

  #region(id: string): Region {
    let r = this.#regions.get(id);
    if (r === undefined) {
      r = {
        views: new Map(),
        syncedAt: Number.NEGATIVE_INFINITY,
        pending: new Map(),
        sending: null,
      };
      this.#regions.set(id, r);
    }
    return r;
  }
}
