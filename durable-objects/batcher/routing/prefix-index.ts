/**
 * Which origin probably holds which prefix blocks (docs/routing.md, "The index"): one
 * bounded LRU of block hashes per origin, and one map from a hash to the origins that
 * hold it, so a prompt's best match on every origin is found in one pass over its blocks.
 * Pure: no clock, no I/O; plain JSON in and out for persistence.
 */

import { MAX_ROUTED_ORIGINS } from "../../../contracts/config/routing.ts";

/** An index as stored: per origin, its block hashes from least to most recently used. */
export interface PrefixIndexSnapshot {
  origins: string[];
  capacity: number[];
  blocks: number[][];
}

/** Bounded per-origin LRU sets of block hashes. */
export class PrefixIndex {
  readonly origins: readonly string[];
  readonly #lru: Map<number, true>[];
  readonly #capacity: number[];
  // Hash -> bit mask of the origins holding it.
  readonly #owners = new Map<number, number>();

  constructor(origins: readonly string[], capacityBlocks: number) {
    if (origins.length > MAX_ROUTED_ORIGINS) {
      throw new RangeError(`an index follows at most ${MAX_ROUTED_ORIGINS} origins`);
    }
    this.origins = [...origins];
    this.#lru = origins.map(() => new Map());
    this.#capacity = origins.map(() => Math.max(1, Math.floor(capacityBlocks)));
  }

  /** Position of an origin, or -1. */
  slot(origin: string): number {
    return this.origins.indexOf(origin);
  }

  /** Blocks the index holds for the origin at `slot`. */
  size(slot: number): number {
    return this.#lru[slot]?.size ?? 0;
  }

  capacity(slot: number): number {
    return this.#capacity[slot] ?? 0;
  }

  /** Sets how many blocks the origin at `slot` can hold, dropping the least recently used. */
  setCapacity(slot: number, blocks: number): void {
    if (this.#capacity[slot] === undefined) return;
    this.#capacity[slot] = Math.max(1, Math.floor(blocks));
    this.#evict(slot);
  }

  /**
   * How many leading blocks of `hashes` each origin holds, by slot: one pass that stops
   * once no origin holds the next block.
   */
  match(hashes: ArrayLike<number>): number[] {
    const matched = this.origins.map(() => 0);
    let mask = this.origins.length === 32 ? -1 : (1 << this.origins.length) - 1;
    let i = 0;
    for (; i < hashes.length && mask !== 0; i++) {
      const held = mask & (this.#owners.get(hashes[i] as number) ?? 0);
      let lost = mask & ~held;
      while (lost !== 0) {
        const bit = 31 - Math.clz32(lost);
        matched[bit] = i;
        lost &= ~(1 << bit);
      }
      mask = held;
    }
    while (mask !== 0) {
      const bit = 31 - Math.clz32(mask);
      matched[bit] = i;
      mask &= ~(1 << bit);
    }
    return matched;
  }

  /**
   * Records that the origin at `slot` holds the first `count` blocks of `hashes` now, as
   * the most recently used; the first block is kept longest, as an engine frees a
   * sequence's tail blocks first.
   */
  store(slot: number, hashes: ArrayLike<number>, count = hashes.length): void {
    const lru = this.#lru[slot];
    if (lru === undefined) return;
    const bit = 1 << slot;
    for (let i = Math.min(count, hashes.length) - 1; i >= 0; i--) {
      const hash = hashes[i] as number;
      if (lru.delete(hash)) lru.set(hash, true);
      else {
        lru.set(hash, true);
        this.#owners.set(hash, (this.#owners.get(hash) ?? 0) | bit);
      }
    }
    this.#evict(slot);
  }

  /** Forgets blocks the origin at `slot` no longer holds. */
  remove(slot: number, hashes: Iterable<number>): number {
    const lru = this.#lru[slot];
    if (lru === undefined) return 0;
    let removed = 0;
    for (const hash of hashes) {
      if (!lru.delete(hash)) continue;
      removed += 1;
      this.#drop(hash, slot);
    }
    return removed;
  }

  /** Forgets everything the origin at `slot` held (it restarted or cleared its cache). */
  clear(slot: number): void {
    const lru = this.#lru[slot];
    if (lru === undefined) return;
    for (const hash of lru.keys()) this.#drop(hash, slot);
    lru.clear();
  }

  snapshot(): PrefixIndexSnapshot {
    return {
      origins: [...this.origins],
      capacity: [...this.#capacity],
      blocks: this.#lru.map((lru) => [...lru.keys()]),
    };
  }

  /** Takes back what a snapshot of the same origins held; other origins' parts are ignored. */
  restore(snapshot: PrefixIndexSnapshot): void {
    for (const [at, origin] of snapshot.origins.entries()) {
      const slot = this.slot(origin);
      if (slot < 0) continue;
      this.clear(slot);
      const blocks = snapshot.blocks[at] ?? [];
      const capacity = snapshot.capacity[at];
      if (capacity !== undefined) this.#capacity[slot] = Math.max(1, capacity);
      const lru = this.#lru[slot] as Map<number, true>;
      const bit = 1 << slot;
      for (const hash of blocks) {
        if (typeof hash !== "number" || lru.has(hash)) continue;
        lru.set(hash, true);
        this.#owners.set(hash, (this.#owners.get(hash) ?? 0) | bit);
      }
      this.#evict(slot);
    }
  }

  #evict(slot: number): void {
    const lru = this.#lru[slot] as Map<number, true>;
    const capacity = this.#capacity[slot] as number;
    while (lru.size > capacity) {
      const oldest = lru.keys().next().value as number;
      lru.delete(oldest);
      this.#drop(oldest, slot);
    }
  }

  #drop(hash: number, slot: number): void {
    const owners = (this.#owners.get(hash) ?? 0) & ~(1 << slot);
    if (owners === 0) this.#owners.delete(hash);
    else this.#owners.set(hash, owners);
  }
}
