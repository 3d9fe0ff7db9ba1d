/**
 * The Batcher's tables (docs/batching.md, "Open calls"; docs/routing.md, "The index"), and
 * `open_batches`: which upstream calls an origin may still be running, so that a later
 * incarnation can cancel them. Rows are written behind, once a call has run for
 * {@link OPEN_BATCH_RECORD_DELAY_MS}; a call that ends sooner never touches storage.
 */
import { applyMigrations } from "../migrations.ts";
import { WriteBehind } from "../write-behind.ts";

/**
 * How long an upstream call runs before its `open_batches` row is written: most calls end
 * sooner and never touch storage.
 */
export const OPEN_BATCH_RECORD_DELAY_MS = 100;

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE open_batches (
     batch_id TEXT PRIMARY KEY, origin_id TEXT NOT NULL, origin_url TEXT NOT NULL,
     sent_at INTEGER NOT NULL, item_ids TEXT NOT NULL);`,
  // The router's index (routing/index-store.ts): one row per origin and one of the rest.
  `CREATE TABLE router_index (part TEXT PRIMARY KEY, data BLOB NOT NULL);`,
];

/** A call an earlier incarnation left open. */
export type OrphanCall = { batch_id: string; origin_id: string; origin_url: string };

/** `open_batches`, with its writes behind. */
export class CallRecords {
  readonly #storage: DurableObjectStorage;
  readonly #writes: WriteBehind;

  constructor(storage: DurableObjectStorage) {
    this.#storage = storage;
    this.#writes = new WriteBehind(storage, OPEN_BATCH_RECORD_DELAY_MS);
  }

  /** Applies the schema; answers how many rows an earlier incarnation left. */
  migrate(): number {
    applyMigrations(this.#storage, MIGRATIONS);
    return this.count();
  }

  /** A call was sent: its row is written once it has run for the record delay. */
  opened(call: { id: string; originId: string; url: string }, sentAt: number, items: string[]) {
    const itemIds = JSON.stringify(items);
    this.#writes.set(keyOf(call.id), () =>
      this.#storage.sql.exec(
        "INSERT INTO open_batches (batch_id, origin_id, origin_url, sent_at, item_ids) VALUES (?, ?, ?, ?, ?)",
        call.id,
        call.originId,
        call.url,
        sentAt,
        itemIds,
      ),
    );
  }

  /** A call's response ended, however it ended. */
  closed(id: string): void {
    const key = keyOf(id);
    // Still queued: the row was never written, so there is nothing to delete.
    if (this.#writes.delete(key)) return;
    this.#writes.set(key, () =>
      this.#storage.sql.exec("DELETE FROM open_batches WHERE batch_id = ?", id),
    );
  }

  /** Rows in the table, queued writes included. */
  count(): number {
    this.#writes.flush();
    return this.#storage.sql.exec<{ n: number }>("SELECT COUNT(*) AS n FROM open_batches").one().n;
  }

  /** Rows of calls that are not `live` (an earlier incarnation's). */
  orphans(live: (id: string) => boolean): OrphanCall[] {
    this.#writes.flush();
    return this.#storage.sql
      .exec<OrphanCall>("SELECT batch_id, origin_id, origin_url FROM open_batches")
      .toArray()
      .filter((row) => !live(row.batch_id));
  }

  /** Deletes an orphan's row once its origin was told to cancel it. */
  remove(id: string): void {
    this.#storage.sql.exec("DELETE FROM open_batches WHERE batch_id = ?", id);
  }
}

function keyOf(batchId: string): string {
  return `batch:${batchId}`;
}
