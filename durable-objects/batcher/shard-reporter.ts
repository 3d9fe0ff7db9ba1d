/**
 * What a Batcher shard tells its region and model's `BatcherShards` (docs/batching.md,
 * "Shards"): its thread lag and items in flight, at most once a second and only while
 * requests come, behind the answers; the count it hears back rides on its answers to the edge.
 */
import type { BatcherShards } from "../batcher-shards/index.ts";
import type { ShardCount } from "../batcher-shards/types.ts";
import type { KeepAlive } from "./keep-alive.ts";
import type { LiveWindow } from "./live-window.ts";
import type { AttemptShard, ShardCountNote } from "./types.ts";
import { meanThreadLagMs } from "./window/terms.ts";

/** Least time between two reports of one shard. */
export const SHARD_REPORT_INTERVAL_MS = 1_000;

/** One shard's reports and the count it last heard. */
export class ShardReporter {
  readonly #directory: DurableObjectNamespace<BatcherShards>;
  readonly #keepAlive: KeepAlive;
  readonly #window: LiveWindow;
  #reportedAt = Number.NEGATIVE_INFINITY;
  #heard: ShardCount | null = null;

  constructor(env: Env, keepAlive: KeepAlive, window: LiveWindow) {
    this.#directory = env.BATCHER_SHARDS;
    this.#keepAlive = keepAlive;
    this.#window = window;
  }

  /** A request came to shard `shard`: reports this shard's load when one is due. */
  note(shard: AttemptShard | undefined, now: number): void {
    if (shard === undefined || shard.scaling.maxShards <= shard.scaling.minShards) return;
    if (now - this.#reportedAt < SHARD_REPORT_INTERVAL_MS) return;
    this.#reportedAt = now;
    const state = this.#window.state;
    const running = state?.origins.reduce((sum, origin) => sum + origin.inFlight.length, 0) ?? 0;
    const load = {
      shard: shard.index,
      lagMs: state === null ? 0 : meanThreadLagMs(state, now),
      inFlight: running + this.#window.queued(),
    };
    const reporting = this.#directory
      .getByName(shard.group)
      .report(load, shard.scaling)
      .then(
        (count) => {
          if (this.#heard === null || count.epoch >= this.#heard.epoch) this.#heard = count;
        },
        // The directory is out of reach: the count stays as last heard.
        () => {},
      );
    this.#keepAlive.waitUntil(reporting);
  }

  /** The count last heard, for an answer to carry (nothing before the first). */
  get heard(): ShardCountNote {
    return this.#heard === null ? {} : { shards: this.#heard };
  }
}
