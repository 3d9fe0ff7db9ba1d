/**
 * BatcherShards: how many Batchers one region and model run (docs/batching.md, "Shards").
 * One object per region, model and settings version. Busy shards report their load about
 * once a second and get the count back; the pure core in `scaling.ts` decides when it
 * doubles or halves. The count is written when it changes; the reports live in memory.
 */
import { DurableObject } from "cloudflare:workers";
import { logWarn } from "../../contracts/log.ts";
import type { ShardScaling } from "../../contracts/config/plans.ts";
import { applyMigrations } from "../migrations.ts";
import { type ShardsState, newShardsState, onShardReport } from "./scaling.ts";
import type { ShardCount, ShardLoad, ShardsView } from "./types.ts";

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE shard_count (
     id INTEGER PRIMARY KEY CHECK (id = 1), count INTEGER NOT NULL, epoch INTEGER NOT NULL,
     changed_at INTEGER NOT NULL, splits TEXT NOT NULL);`,
];

type CountRow = { count: number; epoch: number; changed_at: number; splits: string };

/** The shard count of one region and model, split and merged by its shards' reports. */
export class BatcherShards extends DurableObject<Env> {
  #state: ShardsState | null = null;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      applyMigrations(ctx.storage, MIGRATIONS);
    });
  }

  /** One shard's load; answers the count as it now stands. */
  report(load: ShardLoad, scaling: ShardScaling): ShardCount {
    const now = Date.now();
    const { state, decision } = onShardReport(this.#load(scaling), load, scaling, now);
    this.#state = state;
    if (decision.kind !== "keep") {
      logWarn(`batcher shards ${decision.kind}`, { count: state.count, epoch: state.epoch });
      this.ctx.storage.sql.exec(
        `INSERT INTO shard_count (id, count, epoch, changed_at, splits) VALUES (1, ?, ?, ?, ?)
         ON CONFLICT (id) DO UPDATE SET count = excluded.count, epoch = excluded.epoch,
           changed_at = excluded.changed_at, splits = excluded.splits`,
        state.count,
        state.epoch,
        state.changedAt,
        JSON.stringify(state.splits),
      );
    }
    return { count: state.count, epoch: state.epoch };
  }

  /** The count and each shard's last report (for the admin view and metrics). */
  view(scaling: ShardScaling): ShardsView {
    const state = this.#load(scaling);
    const now = Date.now();
    return {
      count: state.count,
      epoch: state.epoch,
      changedAt: state.changedAt,
      reports: [...state.reports.values()].map(({ at, ...load }) => ({ ...load, ageMs: now - at })),
    };
  }

  #load(scaling: ShardScaling): ShardsState {
    if (this.#state !== null) return this.#state;
    const row = this.ctx.storage.sql
      .exec<CountRow>("SELECT count, epoch, changed_at, splits FROM shard_count")
      .toArray()[0];
    const fresh = newShardsState(scaling);
    this.#state =
      row === undefined
        ? fresh
        : {
            ...fresh,
            count: row.count,
            epoch: row.epoch,
            changedAt: row.changed_at,
            splits: JSON.parse(row.splits) as ShardsState["splits"],
          };
    return this.#state;
  }
}
