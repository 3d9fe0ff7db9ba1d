/**
 * The router's index in the Batcher's `router_index` table (docs/routing.md, "The index"),
 * so that an evicted Batcher starts warm: each origin's block hashes as 32-bit words in LRU
 * order, and one JSON row of the rest. Written at most every {@link INDEX_SAVE_MS} while
 * the router changes, read once per router.
 */
import type { Router, RouterSnapshot } from "./router.ts";

/** Longest a change to the index waits before it is stored. */
export const INDEX_SAVE_MS = 5_000;

interface Meta {
  origins: string[];
  capacity: number[];
  sessions: [string, string][];
  tokensPerEngineToken: number;
}

/** Reads and writes one Batcher's router snapshot. */
export class IndexStore {
  readonly #storage: DurableObjectStorage;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #router: Router | null = null;

  constructor(storage: DurableObjectStorage) {
    this.#storage = storage;
  }

  /** Fills a new router from storage, once. */
  attach(router: Router): void {
    if (this.#router === router) return;
    this.#router = router;
    const snapshot = this.load();
    if (snapshot !== null) router.restore(snapshot);
  }

  /** The attached router changed: stored within {@link INDEX_SAVE_MS}. */
  changed(): void {
    if (this.#timer !== null) return;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      if (this.#router !== null) this.save(this.#router.snapshot());
    }, INDEX_SAVE_MS);
  }

  load(): RouterSnapshot | null {
    const rows = this.#storage.sql
      .exec<{ part: string; data: ArrayBuffer | string }>("SELECT part, data FROM router_index")
      .toArray();
    const metaRow = rows.find((row) => row.part === "meta");
    if (metaRow === undefined || typeof metaRow.data !== "string") return null;
    const meta = JSON.parse(metaRow.data) as Meta;
    const blocks = meta.origins.map((origin) => {
      const row = rows.find((r) => r.part === `origin:${origin}`);
      if (row === undefined || typeof row.data === "string") return [];
      return [...new Uint32Array(row.data.slice(0))];
    });
    return {
      index: { origins: meta.origins, capacity: meta.capacity, blocks },
      sessions: meta.sessions,
      tokensPerEngineToken: meta.tokensPerEngineToken,
    };
  }

  save(snapshot: RouterSnapshot): void {
    const { index } = snapshot;
    const meta: Meta = {
      origins: index.origins,
      capacity: index.capacity,
      sessions: snapshot.sessions,
      tokensPerEngineToken: snapshot.tokensPerEngineToken,
    };
    this.#storage.transactionSync(() => {
      const sql = this.#storage.sql;
      sql.exec("DELETE FROM router_index");
      sql.exec("INSERT INTO router_index (part, data) VALUES ('meta', ?)", JSON.stringify(meta));
      index.origins.forEach((origin, at) => {
        const words = Uint32Array.from(index.blocks[at] ?? []);
        sql.exec(
          "INSERT INTO router_index (part, data) VALUES (?, ?)",
          `origin:${origin}`,
          words.buffer,
        );
      });
    });
  }
}
