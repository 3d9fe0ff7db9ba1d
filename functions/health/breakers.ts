/**
 * The edge isolate's copy of the origins' circuit breakers (docs/failover.md, "Breakers"):
 * outcomes of the requests it sent straight to origins go to each region's `OriginBreakers`
 * in bulk, and the breakers come back with the answer; no Durable Object call per request.
 */
import type { BreakerRegion } from "../../contracts/breaker.ts";
import { BreakerCache } from "../../contracts/breaker-cache.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import type { RegionConfig } from "../../contracts/config/regions.ts";
import { type ApiError, originFailure } from "../../contracts/errors.ts";
import type { OriginBreakers } from "../../durable-objects/origin-breakers/index.ts";
import { retryAfterHeaders } from "../accounts/rate-limit-headers.ts";

/**
 * One isolate's breakers: the copy of every region's breakers (a cache: losing it with
 * the isolate only costs a sync) and the direct attempts to give up should one open.
 */
export class EdgeBreakers {
  /** The copy, exchanged with each region's `OriginBreakers` in bulk. */
  readonly cache: BreakerCache;
  // Attempts sent straight to an origin, to give up should its breaker open.
  readonly #watchers = new Map<string, Set<() => void>>();

  constructor(namespace: DurableObjectNamespace<OriginBreakers>) {
    this.cache = new BreakerCache(
      (region, reports) => namespace.getByName(region.id).report(region, reports),
      {
        onChange: (changed) => {
          for (const view of changed) {
            if (view.state === "closed") continue;
            for (const giveUp of this.#watchers.get(view.origin) ?? []) giveUp();
          }
        },
      },
    );
  }

  /** Calls `giveUp` should `origin`'s breaker open; answers how to stop watching. */
  watch(origin: string, giveUp: () => void): () => void {
    let set = this.#watchers.get(origin);
    if (set === undefined) {
      set = new Set();
      this.#watchers.set(origin, set);
    }
    set.add(giveUp);
    return () => {
      set.delete(giveUp);
      if (set.size === 0) this.#watchers.delete(origin);
    };
  }

  /** Brings the copies of these regions' breakers up to date when due; the work to wait for. */
  sync(config: ResolvedConfig, regions: readonly RegionConfig[], now: number): Promise<unknown>[] {
    const work: Promise<unknown>[] = [];
    for (const region of regions) {
      const sync = this.cache.sync(breakerRegion(config, region), now);
      if (sync !== null) work.push(sync);
    }
    return work;
  }

  /**
   * 503 `no_healthy_origin` for a request every origin of whose model is behind an open
   * breaker, with `retry-after` at the earliest breaker's retry time.
   */
  allOpen(
    regions: readonly RegionConfig[],
    serves: (origin: RegionConfig["origins"][number]) => boolean,
    now: number,
  ): ApiError {
    let earliest: number | null = null;
    for (const region of regions) {
      for (const origin of region.origins) {
        if (!serves(origin)) continue;
        const at = this.cache.view(origin.id)?.retry_at ?? null;
        if (at !== null && (earliest === null || at < earliest)) earliest = at;
      }
    }
    const error = originFailure("unavailable");
    const waitMs = Math.max(1_000, (earliest ?? now + 1_000) - now);
    for (const [name, value] of Object.entries(retryAfterHeaders(waitMs))) {
      error.headers[name] = value;
    }
    return error;
  }
}

/** A configured region as its breakers know it (resolved with the configuration). */
export function breakerRegion(config: ResolvedConfig, region: RegionConfig): BreakerRegion {
  const known = config.breakerRegions.get(region.id);
  if (known === undefined) throw new Error(`region ${region.id} is not configured`);
  return known;
}
