/**
 * Which region serves a caller: the nearest by Cloudflare colo, then country, then
 * continent (as mapped in config), or a region named in `x-warmgate-region`; then every
 * other region in config order as fallbacks. Pure: no runtime imports.
 * See docs/configuration.md.
 */
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import type { RegionConfig } from "../../contracts/config/regions.ts";

/** The caller's location, from `request.cf` (all optional: local runs have none). */
export interface CallerLocation {
  /** IATA code of the Cloudflare data center, e.g. `FRA`. */
  colo?: string | undefined;
  /** ISO 3166-1 alpha-2 country, e.g. `DE`. */
  country?: string | undefined;
  /** Two-letter continent code, e.g. `EU`. */
  continent?: string | undefined;
}

/** The regions to try, nearest first, or the unknown region an override asked for. */
export type RegionOrder =
  | { kind: "ok"; regions: RegionConfig[] }
  | { kind: "unknown_region"; region: string };

function findBy(
  regions: readonly RegionConfig[],
  value: string | undefined,
  field: "colos" | "countries" | "continents",
): RegionConfig | undefined {
  if (value === undefined || value === "") return undefined;
  const upper = value.toUpperCase();
  return regions.find((region) => region[field].some((entry) => entry.toUpperCase() === upper));
}

/** The nearest region for a location: colo beats country beats continent beats the default. */
export function nearestRegion(config: ResolvedConfig, location: CallerLocation): RegionConfig {
  const { regions } = config;
  const found =
    findBy(regions, location.colo, "colos") ??
    findBy(regions, location.country, "countries") ??
    findBy(regions, location.continent, "continents") ??
    regions.find((region) => region.id === config.defaultRegion);
  // The config schema guarantees default_region names a region and regions is non-empty.
  return found ?? (regions[0] as RegionConfig);
}

/** The regions to try in order: the override (or the nearest), then the rest in config order. */
export function regionOrder(
  config: ResolvedConfig,
  location: CallerLocation,
  override?: string | null,
): RegionOrder {
  let first: RegionConfig;
  if (override !== undefined && override !== null && override !== "") {
    const named = config.regions.find((region) => region.id === override);
    if (named === undefined) return { kind: "unknown_region", region: override };
    first = named;
  } else {
    first = nearestRegion(config, location);
  }
  return { kind: "ok", regions: [first, ...config.regions.filter((region) => region !== first)] };
}
