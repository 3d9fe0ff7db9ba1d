/**
 * The calls an earlier incarnation of the Batcher left open (docs/batching.md, "Open
 * calls"): every row of `open_batches` that no live call wrote is cancelled on its origin,
 * then deleted. The alarm runs it; cancelling a call that already ended is harmless.
 */
import { logWarn } from "../../../contracts/log.ts";
import { cancelBatchItems, currentUpstream } from "../../../contracts/upstream.ts";
import type { LiveWindow } from "../live-window.ts";
import type { CallRecords } from "../records.ts";
import type { BatcherCounters } from "../types.ts";
import type { OriginCredentials } from "./credentials.ts";

/** Cancels orphaned calls on their origins. */
export class Orphans {
  readonly #records: CallRecords;
  readonly #credentials: OriginCredentials;
  readonly #window: LiveWindow;
  readonly #counters: BatcherCounters;

  constructor(
    records: CallRecords,
    credentials: OriginCredentials,
    window: LiveWindow,
    counters: BatcherCounters,
  ) {
    this.#records = records;
    this.#credentials = credentials;
    this.#window = window;
    this.#counters = counters;
  }

  /** Cancels every recorded call that is not `live` on its origin, and deletes its row. */
  async cancel(live: (batchId: string) => boolean): Promise<void> {
    const orphans = this.#records.orphans(live);
    await Promise.all(
      orphans.map(async (row) => {
        // Without ids the origin cancels every unfinished item of the call.
        const links = this.#credentials.credentialed(
          this.#window.setup,
          row.origin_id,
          row.origin_url,
        );
        const origin = currentUpstream(links);
        const ok = await cancelBatchItems(origin, row.batch_id);
        if (!ok)
          logWarn("orphaned batch cancel failed", { batch: row.batch_id, origin: row.origin_id });
        this.#counters.orphansCancelled += 1;
        this.#records.remove(row.batch_id);
      }),
    );
  }
}
