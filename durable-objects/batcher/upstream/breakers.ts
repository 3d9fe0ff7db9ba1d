/**
 * A Batcher's copy of its region's origin breakers (docs/failover.md): reported to and
 * refreshed from the region's `OriginBreakers`, each call's verdict told to it, and its
 * changes told to the one listener that acts on them (`Calls.breakersChanged`).
 */
import type { BreakerRegion, BreakerView, Verdict } from "../../../contracts/breaker.ts";
import { BreakerCache } from "../../../contracts/breaker-cache.ts";
import type { KeepAlive } from "../keep-alive.ts";
import type { BatcherSetup } from "../../../contracts/config/plans.ts";

/** The copy of the region's breakers, kept in step with `OriginBreakers`. */
export class RegionBreakers {
  /** The copy, which the window's health rule reads as its breaker gate. */
  readonly cache: BreakerCache;
  readonly #keepAlive: KeepAlive;
  #listener: (changed: BreakerView[]) => void = () => {};

  constructor(env: Env, keepAlive: KeepAlive) {
    this.#keepAlive = keepAlive;
    this.cache = new BreakerCache(
      (region, reports) => env.ORIGIN_BREAKERS.getByName(region.id).report(region, reports),
      { onChange: (changed) => this.#listener(changed) },
    );
  }

  /**
   * Tells `listener` of every change to the copy. Those who act on a change are built on
   * this copy, after it: they listen once they exist.
   */
  listen(listener: (changed: BreakerView[]) => void): void {
    this.#listener = listener;
  }

  /** Tells the origin's breaker what a call showed of it. */
  outcome(setup: BatcherSetup | null, origin: string, verdict: Verdict): void {
    if (setup === null || !setup.breakers.enabled) return;
    const sync = this.cache.record(regionOf(setup), origin, verdict, Date.now());
    if (sync !== null) this.#keepAlive.waitUntil(sync);
  }

  /** Brings the copy of the setup's breakers up to date now; false where breakers are off. */
  async refresh(setup: BatcherSetup): Promise<boolean> {
    if (!setup.breakers.enabled) return false;
    await this.cache.refresh(regionOf(setup), Date.now());
    return true;
  }

  /** Refreshes the copy of the setup's breakers when due. */
  sync(setup: BatcherSetup, now: number): void {
    if (!setup.breakers.enabled) return;
    const sync = this.cache.sync(regionOf(setup), now);
    if (sync !== null) this.#keepAlive.waitUntil(sync);
  }
}

/** The region of a setup as its breakers know it. */
function regionOf(setup: BatcherSetup): BreakerRegion {
  return {
    id: setup.region,
    origins: setup.origins.map((o) => ({ id: o.id, url: o.url })),
    settings: setup.breakers.settings,
  };
}
