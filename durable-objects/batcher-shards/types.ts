/**
 * The contract of `BatcherShards` (docs/batching.md, "Shards"): what a Batcher shard
 * reports of its load, the scaling settings it reports under, and the shard count that
 * the directory answers and every Batcher answer carries to the edge.
 */

/** How many Batchers a region and model run now; `epoch` grows with every change. */
export interface ShardCount {
  count: number;
  epoch: number;
}

/** One shard's load as it reports it. */
export interface ShardLoad {
  shard: number;
  /** Its thread's recent lag (ms, a decaying mean; see `meanThreadLagMs`). */
  lagMs: number;
  /** Items it has admitted and not ended (queued or running). */
  inFlight: number;
}

/** What the directory's `view` answers: the count, and each shard's last report. */
export interface ShardsView extends ShardCount {
  /** When the count last changed (epoch ms; 0: never). */
  changedAt: number;
  /** Each shard's last load report, with its age (ms). */
  reports: (ShardLoad & { ageMs: number })[];
}
