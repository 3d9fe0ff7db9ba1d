/**
 * Where and how each region's requests for each model are batched (docs/batching.md;
 * docs/configuration.md, "Batching"): the plan of every region and model, built once when
 * the configuration loads, and the setup a Batcher runs with, which names it.
 */
import { fnv1a } from "../hashing.ts";
import { BATCH_LANE, type BatchingSettings, type WindowConfig } from "./batching.ts";
import type { Breakers } from "./breakers.ts";
import { type RegionConfig, originServes } from "./regions.ts";
import type { RouterSettings } from "./routing.ts";

/** What a Batcher runs with; the edge takes it from the configuration and sends it along. */
export interface BatcherSetup {
  /** Hash of everything below; part of the object's name. */
  version: string;
  /** The region whose origins it batches for (its breakers are that region's). */
  region: string;
  /**
   * Whether the origins' breakers apply, and how slow an origin may be: a first byte of a
   * streamed item, or any frame of a call, slower than `slowFirstByteMs` is a failure.
   */
  breakers: Breakers;
  /** The window policy's settings, defaults filled in. */
  window: WindowConfig;
  /**
   * Where each origin of `window.origins` listens, and the names of the secrets it takes
   * as bearer tokens, in order of rotation (default `ORIGIN_TOKEN`).
   */
  origins: { id: string; url: string; credentials?: string[] }[];
  /** How requests are routed to warm prefix caches (docs/routing.md); null: off. */
  routing: RouterSettings | null;
  /** How long an origin whose call failed is skipped. */
  quarantineMs: number;
  /** Most bytes a streamed client's body may have waiting behind its stream (see `client-body.ts`). */
  clientBacklogBytes: number;
}

/** When a region and model's Batchers split and merge (docs/batching.md, "Shards"). */
export interface ShardScaling {
  /** Fewest shards (`shards`), and the count before the first split. */
  minShards: number;
  /** Most shards (`max_shards`); equal to `minShards`: the count is fixed. */
  maxShards: number;
  /** Thread lag (ms) past which a shard that keeps lagging asks for a split. */
  splitLagMs: number;
}

/** Where and how one region's requests for one model are batched. */
export interface BatchingPlan {
  /** False: the unbatched path, one call per request straight to the origin. */
  enabled: boolean;
  setup: BatcherSetup;
  /** Fewest shards; the count in force is the region and model's `BatcherShards`'. */
  shards: number;
  shardBy: "request" | "key";
  scaling: ShardScaling;
  /** Lane of a caller with no tier, clamped to the lanes there are. */
  defaultLane: number;
  /** See `batching.idle_bypass_ms`; 0 never bypasses the batcher. */
  idleBypassMs: number;
}

/** The plans of a configuration, by region and model (see {@link batchingPlan}). */
export type BatchingPlans = ReadonlyMap<string, BatchingPlan>;

function planKey(region: string, model: string): string {
  return `${region}\u0000${model}`;
}

/** The batching plan of a region and model; null when no origin of the region serves it. */
export function batchingPlan(
  config: { plans: BatchingPlans },
  region: Pick<RegionConfig, "id">,
  model: string,
): BatchingPlan | null {
  return config.plans.get(planKey(region.id, model)) ?? null;
}

/** What every plan is built from. */
export interface PlanInputs {
  regions: readonly RegionConfig[];
  models: readonly { id: string }[];
  /** The settings of a region and model, overrides applied. */
  settingsOf: (region: string, model: string) => BatchingSettings;
  breakers: Breakers;
  routing: { enabled: boolean; settings: RouterSettings };
}

/** The plan of every region and model that region serves. */
export function buildPlans(inputs: PlanInputs): BatchingPlans {
  const plans = new Map<string, BatchingPlan>();
  for (const region of inputs.regions) {
    for (const model of inputs.models) {
      const plan = buildPlan(inputs, region, model.id);
      if (plan !== null) plans.set(planKey(region.id, model.id), plan);
    }
  }
  return plans;
}

function buildPlan(inputs: PlanInputs, region: RegionConfig, model: string): BatchingPlan | null {
  const origins = region.origins.filter((origin) => originServes(origin, model));
  if (origins.length === 0) return null;
  const settings = inputs.settingsOf(region.id, model);
  // The batch lane comes after every configured lane (docs/batch-api.md).
  const window: WindowConfig = {
    ...settings.window,
    lanes: [...settings.window.lanes, BATCH_LANE],
    batchLane: settings.window.lanes.length,
    origins: origins.map((origin) => ({ id: origin.id })),
  };
  const { quarantineMs, clientBacklogBytes } = settings;
  const urls = origins.map((origin) => ({
    id: origin.id,
    url: origin.url,
    ...(origin.credentials !== undefined && { credentials: origin.credentials }),
  }));
  const { breakers } = inputs;
  // With one origin there is nothing to choose: such a region's lone requests may bypass.
  const routed = inputs.routing.enabled && origins.length > 1;
  const routing = routed ? inputs.routing.settings : null;
  const versioned = { window, urls, quarantineMs, clientBacklogBytes, breakers, routing };
  return {
    enabled: settings.enabled,
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
    shards: settings.shards,
    shardBy: settings.shardBy,
    scaling: settings.scaling,
    defaultLane: settings.defaultLane,
    idleBypassMs: settings.idleBypassMs,
  };
}
