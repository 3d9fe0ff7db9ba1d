/**
 * Which of its region and model's Batchers serves a request (docs/batching.md): its
 * priority lane, its shard, and the Batcher's name, by the plan the configuration resolved
 * (`contracts/config/plans.ts`).
 */
import type { BatchingPlan } from "../../contracts/config/plans.ts";
import { invalidRequest } from "../../contracts/errors.ts";
import { fnv1a } from "../../contracts/hashing.ts";
import { prefixKey, shardOfKey } from "../../contracts/prefix-blocks.ts";
import type { AttemptShard, ShardCountNote } from "../../durable-objects/batcher/types.ts";
import type { BatcherMemo } from "./batcher-memo.ts";

/** Request header that moves a request to a lower-priority lane (never a higher one). */
export const PRIORITY_HEADER = "x-warmgate-priority";

/** Lane of each key tier when the lanes are the default three (interactive, standard, background). */
export const TIER_LANES: Readonly<Record<string, number>> = { high: 0, standard: 1, low: 2 };

/**
 * The lane of a request: its key tier's (or the default), moved down by the priority
 * header when that names a lower lane (`high`, `standard`, `low`, or a lane number).
 */
export function laneFor(
  plan: BatchingPlan,
  tier: string | undefined,
  header: string | undefined,
): number {
  // The batch lane is for Batch API lines only: a caller's lane is an interactive one.
  const { lanes, batchLane } = plan.setup.window;
  const last = (batchLane ?? lanes.length) - 1;
  const tierLane = tier === undefined ? undefined : TIER_LANES[tier];
  const base = Math.min(tierLane ?? plan.defaultLane, last);
  const asked = parsePriority(header);
  // Only lower: a caller may give up priority, never take more than its key has.
  return asked === null ? base : Math.min(Math.max(base, asked), last);
}

/** 400 `invalid_value` for a priority header that names no lane (checked before dispatch). */
export function checkPriority(header: string | undefined): void {
  if (header === undefined || parsePriority(header) !== null) return;
  throw invalidRequest(
    `${PRIORITY_HEADER} is '${header.slice(0, 64)}': high, standard, low or a lane number (0 to 99).`,
    PRIORITY_HEADER,
    "invalid_value",
  );
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
 * Name of the `BatcherShards` of a region and model, which holds how many Batchers they run:
 * `region:model:version:min-max` (other shard bounds start anew, at their fewest).
 */
export function batcherGroup(region: string, model: string, plan: BatchingPlan): string {
  const { minShards, maxShards } = plan.scaling;
  return `${region}:${model}:${plan.setup.version}:${minShards}-${maxShards}`;
}

/**
 * The shard of a request among `count` (the plan's fewest until its Batchers tell more):
 * where routing is on, a hash of its first prefix blocks, so that one shard's index is the
 * authority for a prefix; else a hash of its request id or its key id, per `shard_by`.
 */
export function shardOf(
  plan: BatchingPlan,
  requestId: string,
  keyId: string | undefined,
  blocks: readonly number[] | null = null,
  count = plan.shards,
): number {
  if (count === 1) return 0;
  const key = plan.setup.routing === null || blocks === null ? null : prefixKey(blocks);
  if (key !== null) return shardOfKey(key, count);
  const basis = plan.shardBy === "key" && keyId !== undefined ? keyId : requestId;
  return shardOfKey(Number.parseInt(fnv1a(basis), 16), count);
}

/**
 * Where an attempt goes among its region and model's shards, as many as their Batchers last
 * said (docs/batching.md, "Shards"): the shard's index, what the attempt tells its Batcher
 * of it (where the count may change), and how to take in the count its answer carries.
 */
export function shardRoute(
  plan: BatchingPlan,
  region: string,
  route: { model: string; keyId: string | undefined },
  request: { requestId: string },
  prefix: { blocks: readonly number[] } | null,
  memo: BatcherMemo | undefined,
): { index: number; shard?: AttemptShard; heard: (note: ShardCountNote) => void } {
  const group = batcherGroup(region, route.model, plan);
  const count = memo?.shardCounts.get(group)?.count ?? plan.shards;
  const index = shardOf(plan, request.requestId, route.keyId, prefix?.blocks ?? null, count);
  const heard = (note: ShardCountNote) => memo?.heardShards(group, note.shards);
  if (plan.scaling.maxShards <= plan.scaling.minShards) return { index, heard };
  return { index, shard: { group, index, scaling: plan.scaling }, heard };
}
