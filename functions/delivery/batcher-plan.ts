/**
 * Where and how a region's requests for a model are batched (docs/batching.md): the plan
 * from the `batching` settings and their overrides, a request's priority lane, its shard,
 * and the name of the Batcher that serves it.
 */
import type { BatcherSetup } from "../../durable-objects/batcher/types.ts";
import {
  BATCHING_DEFAULTS,
  type BatchingSettings,
  COLD_KEY_BLOCKS,
  routerSettingsOf,
  routingEnabled,
  windowConfigOf,
} from "../../durable-objects/batcher/settings.ts";
import {
  breakerSettingsOf,
  breakersEnabled,
} from "../../durable-objects/origin-breakers/settings.ts";
import { type GatewayConfig, type RegionConfig, originServes } from "../config.ts";

/** Request header that moves a request to a lower-priority lane (never a higher one). */
export const PRIORITY_HEADER = "x-warmgate-priority";

/** Lane of each key tier when the lanes are the default three (interactive, standard, background). */
export const TIER_LANES: Readonly<Record<string, number>> = { high: 0, standard: 1, low: 2 };

/** Where and how one region's requests for one model are batched. */
export interface BatchingPlan {
  /** False: the unbatched path, one call per request straight to the origin. */
  enabled: boolean;
  setup: BatcherSetup;
  shards: number;
  shardBy: "request" | "key";
  /** Lane of a caller with no tier, clamped to the lanes there are. */
  defaultLane: number;
  /** See `batching.idle_bypass_ms`; 0 never bypasses the batcher. */
  idleBypassMs: number;
}

const plans = new WeakMap<GatewayConfig, Map<string, BatchingPlan | null>>();

/**
 * The batching plan for a region and model (null when no origin of the region serves it).
 * Global settings first, then each matching override in order; cached per config.
 */
export function batchingPlan(
  config: GatewayConfig,
  region: RegionConfig,
  model: string,
): BatchingPlan | null {
  let byTarget = plans.get(config);
  if (byTarget === undefined) {
    byTarget = new Map();
    plans.set(config, byTarget);
  }
  const key = `${region.id}\u0000${model}`;
  const cached = byTarget.get(key);
  if (cached !== undefined) return cached;
  const plan = buildPlan(config, region, model);
  byTarget.set(key, plan);
  return plan;
}

function buildPlan(
  config: GatewayConfig,
  region: RegionConfig,
  model: string,
): BatchingPlan | null {
  const batching = config.batching;
  const origins = region.origins.filter((origin) => originServes(origin, model));
  if (origins.length === 0) return null;
  const { overrides, ...base } = batching;
  let settings: BatchingSettings = base;
  for (const { region: r, model: m, ...override } of overrides) {
    if ((r === undefined || r === region.id) && (m === undefined || m === model)) {
      settings = { ...settings, ...definedOnly(override) };
    }
  }
  const window = windowConfigOf(
    settings,
    origins.map((origin) => origin.id),
  );
  const d = BATCHING_DEFAULTS;
  const quarantineMs = settings.origin_quarantine_ms ?? d.origin_quarantine_ms;
  const clientBacklogBytes = settings.max_client_backlog_bytes ?? d.max_client_backlog_bytes;
  const urls = origins.map((origin) => ({
    id: origin.id,
    url: origin.url,
    ...(origin.credentials !== undefined && { credentials: origin.credentials }),
  }));
  const breakers = {
    enabled: breakersEnabled(config.breakers),
    settings: breakerSettingsOf(config.breakers),
  };
  // With one origin there is nothing to choose: such a region's lone requests may bypass.
  const routed = routingEnabled(config.routing) && origins.length > 1;
  const routing = routed ? routerSettingsOf(config.routing) : null;
  const versioned = { window, urls, quarantineMs, clientBacklogBytes, breakers, routing };
  return {
    enabled: settings.enabled ?? d.enabled,
    setup: {
      version: fnv1a(JSON.stringify(versioned)),
      region: region.id,
      breakers,
      window,
      origins: urls,
      quarantineMs,
      clientBacklogBytes,
      routing,
    },
    shards: settings.shards ?? d.shards,
    shardBy: settings.shard_by ?? d.shard_by,
    defaultLane: Math.min(settings.default_lane ?? d.default_lane, window.lanes.length - 1),
    idleBypassMs: settings.idle_bypass_ms ?? d.idle_bypass_ms,
  };
}

function definedOnly<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * The lane of a request: its key tier's (or the default), moved down by the priority
 * header when that names a lower lane (`high`, `standard`, `low`, or a lane number).
 */
export function laneFor(
  plan: BatchingPlan,
  tier: string | undefined,
  header: string | undefined,
): number {
  const last = plan.setup.window.lanes.length - 1;
  const tierLane = tier === undefined ? undefined : TIER_LANES[tier];
  const base = Math.min(tierLane ?? plan.defaultLane, last);
  const asked = parsePriority(header);
  // Only lower: a caller may give up priority, never take more than its key has.
  return asked === null ? base : Math.min(Math.max(base, asked), last);
}

function parsePriority(header: string | undefined): number | null {
  if (header === undefined) return null;
  const value = header.trim().toLowerCase();
  const tierLane = TIER_LANES[value];
  if (tierLane !== undefined) return tierLane;
  return /^\d{1,2}$/.test(value) ? Number(value) : null;
}

/** Name of the batcher for a region, model and shard: `region:model:shard:version`. */
export function batcherName(
  region: string,
  model: string,
  shard: number,
  plan: BatchingPlan,
): string {
  return `${region}:${model}:${shard}:${plan.setup.version}`;
}

/**
 * The shard of a request: where routing is on, a hash of its first prefix blocks, so that
 * one shard's index is the authority for a prefix; else a hash of its request id or its
 * key id, per `shard_by`.
 */
export function shardOf(
  plan: BatchingPlan,
  requestId: string,
  keyId: string | undefined,
  blocks: readonly number[] | null = null,
): number {
  if (plan.shards === 1) return 0;
  if (plan.setup.routing !== null && blocks !== null && blocks.length > 0) {
    const first = blocks[Math.min(blocks.length, COLD_KEY_BLOCKS) - 1] as number;
    return first % plan.shards;
  }
  const basis = plan.shardBy === "key" && keyId !== undefined ? keyId : requestId;
  return Number.parseInt(fnv1a(basis), 16) % plan.shards;
}

/** 32-bit FNV-1a of a string, as 8 hex digits: stable names and shard choice, not security. */
export function fnv1a(text: string): string {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return (hash >>> 0).toString(16).padStart(8, "0");
}
