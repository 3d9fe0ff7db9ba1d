/**
 * The edge isolate's copy of the origins' circuit breakers (docs/failover.md, "Breakers"):
 * outcomes of the requests it sent straight to origins go to each region's `OriginBreakers`
 * in bulk, and the breakers come back with the answer; no Durable Object call per request.
 */
import { env } from "cloudflare:workers";
import type { BreakerRegion, BreakerSettings } from "../contracts/breaker.ts";
import { BreakerCache } from "../contracts/breaker-cache.ts";
import { breakerSettingsOf, breakersEnabled } from "../durable-objects/origin-breakers/settings.ts";
import { type ApiError, originFailure } from "../contracts/errors.ts";
import { type GatewayConfig, type RegionConfig, originServes } from "./config.ts";
import { retryAfterHeaders } from "./rate-limit-headers.ts";

/** This isolate's breakers (a cache: losing it with the isolate only costs a sync). */
export const edgeBreakers = new BreakerCache(
  (region, reports) => env.ORIGIN_BREAKERS.getByName(region.id).report(region, reports),
  {
    onChange: (changed) => {
      for (const view of changed) {
        if (view.state === "closed") continue;
        for (const giveUp of watchers.get(view.origin) ?? []) giveUp();
      }
    },
  },
);

// Attempts sent straight to an origin, to give up should its breaker open.
const watchers = new Map<string, Set<() => void>>();

/** Calls `giveUp` should `origin`'s breaker open; answers how to stop watching. */
export function watchBreaker(origin: string, giveUp: () => void): () => void {
  let set = watchers.get(origin);
  if (set === undefined) {
    set = new Set();
    watchers.set(origin, set);
  }
  set.add(giveUp);
  return () => {
    set.delete(giveUp);
    if (set.size === 0) watchers.delete(origin);
  };
}

const regionsOf = new WeakMap<GatewayConfig, Map<string, BreakerRegion>>();
const settingsOf = new WeakMap<GatewayConfig, BreakerSettings>();

/** The breaker settings of `config`, defaults filled in (cached per config). */
export function breakerSettings(config: GatewayConfig): BreakerSettings {
  let settings = settingsOf.get(config);
  if (settings === undefined) {
    settings = breakerSettingsOf(config.breakers);
    settingsOf.set(config, settings);
  }
  return settings;
}

/** A configured region as its breakers know it (cached per config). */
export function breakerRegion(config: GatewayConfig, region: RegionConfig): BreakerRegion {
  let byId = regionsOf.get(config);
  if (byId === undefined) {
    byId = new Map();
    regionsOf.set(config, byId);
  }
  let known = byId.get(region.id);
  if (known === undefined) {
    known = {
      id: region.id,
      origins: region.origins.map((origin) => {
        // A model it serves: the probes of its breaker complete one token of it.
        const probeModel = config.models.find((m) => originServes(origin, m.id))?.id;
        return {
          id: origin.id,
          url: origin.url,
          ...(origin.credentials !== undefined && { credentials: origin.credentials }),
          ...(probeModel !== undefined && { probeModel }),
        };
      }),
      settings: breakerSettings(config),
    };
    byId.set(region.id, known);
  }
  return known;
}

/** Whether breakers apply under `config` (`breakers.enabled`, default true). */
export function breakersOn(config: GatewayConfig): boolean {
  return breakersEnabled(config.breakers);
}

/** Brings the copies of these regions' breakers up to date when due; the work to wait for. */
export function syncBreakers(
  config: GatewayConfig,
  regions: readonly RegionConfig[],
  now: number,
): Promise<unknown>[] {
  const work: Promise<unknown>[] = [];
  for (const region of regions) {
    const sync = edgeBreakers.sync(breakerRegion(config, region), now);
    if (sync !== null) work.push(sync);
  }
  return work;
}

/**
 * 503 `no_healthy_origin` for a request every origin of whose model is behind an open
 * breaker, with `retry-after` at the earliest breaker's retry time.
 */
export function allOriginsOpen(
  regions: readonly RegionConfig[],
  serves: (origin: RegionConfig["origins"][number]) => boolean,
  now: number,
): ApiError {
  let earliest: number | null = null;
  for (const region of regions) {
    for (const origin of region.origins) {
      if (!serves(origin)) continue;
      const at = edgeBreakers.view(origin.id)?.retry_at ?? null;
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
