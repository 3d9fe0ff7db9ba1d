/**
 * The simulated paged KV cache (vLLM V1's KVCacheManager in miniature). Pure: no timers,
 * no clock; the scheduler drives it.
 *
 * Invariants: a block is in exactly one of three places (referenced by sequences, the
 * empty pool, or the evictable LRU list); referenced + empty + evictable = capacity;
 * a block whose hash is registered holds exactly the tokens that hash names.
 * See docs/configuration.md, "The simulated engine".
 */
import { Hasher, hashString } from "./hash.ts";

/** Sequence key as the scheduler names it. */
export type SeqId = string;

/** Sizing of {@link KvCache}. */
export interface KvCacheOptions {
  /** Capacity in blocks (the simulated GPU memory). */
  numBlocks: number;
  /** Tokens per block. */
  blockSize: number;
}

/** Cached full blocks at the start of a token sequence. */
export interface PrefixHit {
  /** Ids of the cached blocks, in order. */
  blocks: number[];
  /** Their chained hashes. */
  hashes: number[];
  /** Tokens those blocks hold. */
  tokens: number;
}

/**
 * A change to the prefix cache, as vLLM's KV-cache events report it: a sequence's blocks
 * from chain position `start` were stored, or a cached block was evicted.
 */
export type CacheEvent =
  | { kind: "stored"; seq: SeqId; start: number; hashes: number[] }
  | { kind: "removed"; hash: number };

/** Outcome of {@link KvCache.allocate}: failure is a value, never a throw. */
export type AllocateResult =
  | { ok: true; newBlocks: number }
  | { ok: false; reason: "out_of_blocks"; needed: number; available: number };

interface SeqBlocks {
  model: string;
  blocks: number[];
  /** Chained hashes of the sequence's full blocks computed so far. */
  hashes: number[];
}

const NO_HASH = -1;

/** Root of a model's hash chain, so equal tokens under different models never collide. */
function modelRoot(model: string): number {
  return hashString(model, 0x6b76);
}

/** Hash of one full block: hash(parent hash, model, block tokens). */
export function chainBlockHash(
  parent: number,
  model: string,
  tokens: ArrayLike<number>,
  start: number,
  end: number,
): number {
  return new Hasher(0x626c6b).int(parent).str(model).ints(tokens, start, end).digest();
}

/** A fixed-capacity paged KV cache with prefix reuse and LRU eviction. */
export class KvCache {
  readonly numBlocks: number;
  readonly blockSize: number;
  /** Prompt tokens looked up by admitted sequences since start. */
  prefixQueries = 0;
  /** Of those, tokens served from cache. */
  prefixHits = 0;
  /** Cached blocks dropped to make room. */
  evictions = 0;
  /** Told of every stored and evicted block, when set. */
  onEvent: ((event: CacheEvent) => void) | null = null;

  readonly #refCount: Int32Array;
  readonly #blockHash: Float64Array;
  readonly #empty: number[];
  // Map iteration order is insertion order: the first entry is the least recently used.
  readonly #evictable = new Map<number, true>();
  readonly #byHash = new Map<number, number>();
  readonly #seqs = new Map<SeqId, SeqBlocks>();

  constructor(options: KvCacheOptions) {
    if (!Number.isInteger(options.numBlocks) || options.numBlocks < 1) {
      throw new RangeError(`numBlocks must be a positive integer, got ${options.numBlocks}`);
    }
    if (!Number.isInteger(options.blockSize) || options.blockSize < 1) {
      throw new RangeError(`blockSize must be a positive integer, got ${options.blockSize}`);
    }
    this.numBlocks = options.numBlocks;
    this.blockSize = options.blockSize;
    this.#refCount = new Int32Array(options.numBlocks);
    this.#blockHash = new Float64Array(options.numBlocks).fill(NO_HASH);
    // Popped from the end, so block 0 is handed out first.
    this.#empty = Array.from({ length: options.numBlocks }, (_, i) => options.numBlocks - 1 - i);
  }

  /** Blocks free or evictable: what a new allocation may take. */
  get freeBlocks(): number {
    return this.#empty.length + this.#evictable.size;
  }

  /** Blocks referenced by at least one sequence. */
  get referencedBlocks(): number {
    return this.numBlocks - this.freeBlocks;
  }

  /** Blocks holding a registered prefix hash (referenced or evictable). */
  get cachedBlocks(): number {
    return this.#byHash.size;
  }

  /** Fraction of blocks in use, 0..1 (vLLM's `kv_cache_usage_perc`). */
  get usage(): number {
    return this.referencedBlocks / this.numBlocks;
  }

  /** Sequences holding blocks. */
  get sequences(): number {
    return this.#seqs.size;
  }

  /** Reference count of a block (for tests and invariant checks). */
  refCount(block: number): number {
    return this.#refCount[block] ?? 0;
  }

  /** Block ids a sequence holds, in order. */
  blocksOf(seq: SeqId): readonly number[] {
    return this.#seqs.get(seq)?.blocks ?? [];
  }

  /** Unreferenced cached blocks, least recently used first. */
  evictionOrder(): number[] {
    return [...this.#evictable.keys()];
  }

  /** Chained hashes of every full block of `tokens` under `model`. */
  blockHashes(model: string, tokens: ArrayLike<number>): number[] {
    const hashes: number[] = [];
    let parent = modelRoot(model);
    for (let end = this.blockSize; end <= tokens.length; end += this.blockSize) {
      parent = chainBlockHash(parent, model, tokens, end - this.blockSize, end);
      hashes.push(parent);
    }
    return hashes;
  }

  /**
   * Longest run of cached full blocks at the start of `tokens`. At least one token is
   * always left to compute (the last position's logits are needed), as in vLLM.
   * Has no side effects: statistics count only when {@link allocate} admits the hit.
   */
  lookup(model: string, tokens: ArrayLike<number>): PrefixHit {
    const maxBlocks = Math.floor(Math.max(0, tokens.length - 1) / this.blockSize);
    const blocks: number[] = [];
    const hashes: number[] = [];
    let parent = modelRoot(model);
    for (let i = 0; i < maxBlocks; i++) {
      const start = i * this.blockSize;
      parent = chainBlockHash(parent, model, tokens, start, start + this.blockSize);
      const block = this.#byHash.get(parent);
      if (block === undefined) break;
      blocks.push(block);
      hashes.push(parent);
    }
    return { blocks, hashes, tokens: blocks.length * this.blockSize };
  }

  /**
   * Makes `seq` hold enough blocks for `numTokens` tokens. A new sequence passes the hit
   * from {@link lookup} (taken just before, with no allocation in between) to share
   * those blocks. Allocates nothing when there is not room for all of it.
   */
  allocate(
    seq: SeqId,
    model: string,
    numTokens: number,
    hit: PrefixHit | null = null,
    queriedTokens = 0,
  ): AllocateResult {
    const existing = this.#seqs.get(seq);
    const held = existing?.blocks.length ?? hit?.blocks.length ?? 0;
    const needed = Math.max(0, Math.ceil(numTokens / this.blockSize) - held);
    // Hit blocks that sit in the evictable list stop being available once touched.
    let touchedEvictable = 0;
    if (existing === undefined && hit !== null) {
      for (const block of hit.blocks) if (this.#refCount[block] === 0) touchedEvictable++;
    }
    const available = this.freeBlocks - touchedEvictable;
    if (needed > available) return { ok: false, reason: "out_of_blocks", needed, available };

    let entry = existing;
    if (entry === undefined) {
      entry = { model, blocks: [], hashes: [] };
      this.#seqs.set(seq, entry);
      if (hit !== null) {
        for (const block of hit.blocks) this.#ref(block);
        entry.blocks.push(...hit.blocks);
        entry.hashes.push(...hit.hashes);
        this.prefixQueries += queriedTokens;
        this.prefixHits += hit.tokens;
      }
    }
    for (let i = 0; i < needed; i++) entry.blocks.push(this.#take());
    return { ok: true, newBlocks: needed };
  }

  /**
   * Registers the sequence's full blocks among its first `numComputed` tokens in the
   * prefix cache, so later requests can reuse them.
   */
  commit(seq: SeqId, tokens: ArrayLike<number>, numComputed: number): void {
    const entry = this.#seqs.get(seq);
    if (entry === undefined) return;
    const full = Math.min(Math.floor(numComputed / this.blockSize), entry.blocks.length);
    let parent = entry.hashes.at(-1) ?? modelRoot(entry.model);
    const first = entry.hashes.length;
    for (let i = first; i < full; i++) {
      const start = i * this.blockSize;
      parent = chainBlockHash(parent, entry.model, tokens, start, start + this.blockSize);
      entry.hashes.push(parent);
      const block = entry.blocks[i];
      // A block with the same content is cached already: keep that one, leave this unhashed.
      if (block === undefined || this.#byHash.has(parent)) continue;
      this.#byHash.set(parent, block);
      this.#blockHash[block] = parent;
    }
    if (this.onEvent !== null && full > first) {
      this.onEvent({ kind: "stored", seq, start: first, hashes: entry.hashes.slice(first, full) });
    }
  }

  /** Releases every block of `seq`; cached ones stay reusable until evicted. */
  free(seq: SeqId): void {
    const entry = this.#seqs.get(seq);
    if (entry === undefined) return;
    this.#seqs.delete(seq);
    // Tail blocks are released first so they are evicted before the shared head of a prefix.
    for (let i = entry.blocks.length - 1; i >= 0; i--) {
      const block = entry.blocks[i];
      if (block === undefined) continue;
      const count = (this.#refCount[block] ?? 0) - 1;
      this.#refCount[block] = count;
      if (count > 0) continue;
      if (this.#blockHash[block] === NO_HASH) this.#empty.push(block);
      else this.#evictable.set(block, true);
    }
  }

  #ref(block: number): void {
    const count = this.#refCount[block] ?? 0;
    if (count === 0) this.#evictable.delete(block);
    this.#refCount[block] = count + 1;
  }

  #take(): number {
    let block = this.#empty.pop();
    if (block === undefined) {
      const lru = this.#evictable.keys().next();
      if (lru.done === true) throw new Error("KV cache accounting bug: no block to take");
      block = lru.value;
      this.#evictable.delete(block);
      const hash = this.#blockHash[block] ?? NO_HASH;
      if (this.#byHash.get(hash) === block) {
        this.#byHash.delete(hash);
        this.onEvent?.({ kind: "removed", hash });
      }
      this.#blockHash[block] = NO_HASH;
      this.evictions++;
    }
    this.#refCount[block] = 1;
    return block;
  }
}
