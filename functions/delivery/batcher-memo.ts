/**
 * What an edge isolate remembers of the batchers it sends through (docs/batching.md,
 * "Settings": `idle_bypass_ms`, `wait_share`; "Shards"); held by the isolate's `EdgeState`.
 */
import type { ShardCount } from "../../durable-objects/batcher-shards/types.ts";

const FIRST_BYTE_SMOOTHING = 0.2;

/** What an isolate remembers of its batchers, by region, model and batching version. */
export class BatcherMemo {
  /**
   * When each batcher (by name without shard) last sent one of this isolate's requests at
   * once. A cache: losing it only costs a batcher call.
   */
  readonly sentAtOnce = new Map<string, number>();
  /**
   * A moving average of how long requests waited for their HEAD from the start of their
   * dispatch, which the batcher's window weighs (see `wait_share`).
   */
  readonly firstByteMs = new Map<string, number>();
  /** How many shards each batcher group runs, as its Batchers last said (the latest epoch). */
  readonly shardCounts = new Map<string, ShardCount>();

  /**
   * Takes in how long an attempt through batcher `name` waited for its HEAD. A refusal
   * (busy, failed, or the request's own error) comes fast and says nothing of how long
   * first bytes take: only a HEAD of an answer served (2xx) counts.
   */
  heardFirstByte(name: string, head: { status: number }, waitedMs: number): void {
    if (head.status < 200 || head.status >= 300) return;
    const previous = this.firstByteMs.get(name);
    const next =
      previous === undefined ? waitedMs : previous + FIRST_BYTE_SMOOTHING * (waitedMs - previous);
    this.firstByteMs.set(name, next);
  }

  /** Takes in the shard count a Batcher's answer carried, unless an older one. */
  heardShards(group: string, count: ShardCount | undefined): void {
    if (count === undefined) return;
    const known = this.shardCounts.get(group);
    if (known === undefined || count.epoch > known.epoch) this.shardCounts.set(group, count);
  }
  /**
   * Batchers (by full name) known to hold their settings: calls to them leave the settings
   * out. A cache: one that lost them answers `setup_needed` and is sent them again.
   */
  readonly holdingSetup = new Set<string>();
}
