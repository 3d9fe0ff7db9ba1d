/**
 * How many Batchers a region and model run now, for the admin view and metrics
 * (docs/batching.md, "Shards"): their `BatcherShards`' count and each shard's last report.
 */
import type { BatchingPlan } from "../../contracts/config/plans.ts";
import type { BatcherShards } from "../../durable-objects/batcher-shards/index.ts";
import type { ShardsView } from "../../durable-objects/batcher-shards/types.ts";
import { batcherGroup } from "./batcher-plan.ts";

/**
 * The shard count of a region and model and each shard's last load report, from its
 * `BatcherShards` (for the admin view and metrics); null where the count is fixed.
 */
export async function shardsView(
  namespace: DurableObjectNamespace<BatcherShards>,
  region: string,
  model: string,
  plan: BatchingPlan,
): Promise<ShardsView | null> {
  if (plan.scaling.maxShards <= plan.scaling.minShards) return null;
  return namespace.getByName(batcherGroup(region, model, plan)).view(plan.scaling);
}
