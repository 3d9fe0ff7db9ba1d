import { describe, expect, it } from "vitest";
import { KvCache } from "../../../origin/sim/kv-cache.ts";

const BS = 16;

/** Tokens `start, start+1, …` — distinct content per block. */
function seqTokens(length: number, start = 0): number[] {
  return Array.from({ length }, (_, i) => start + i);
}

/** Admits a sequence the way the scheduler does (lookup, allocate, compute all, commit). */
function run(cache: KvCache, id: string, tokens: number[], model = "m"): number {
  const hit = cache.lookup(model, tokens);
  const result = cache.allocate(id, model, tokens.length, hit, tokens.length);
  if (!result.ok) throw new Error(`allocation failed for ${id}`);
  cache.commit(id, tokens, tokens.length);
  return hit.tokens;
}

function checkInvariants(cache: KvCache): void {
  expect(cache.referencedBlocks + cache.freeBlocks).toBe(cache.numBlocks);
  expect(cache.referencedBlocks).toBeLessThanOrEqual(cache.numBlocks);
  expect(cache.usage).toBeGreaterThanOrEqual(0);
  expect(cache.usage).toBeLessThanOrEqual(1);
}

describe("KvCache", () => {
  it("serves the full blocks of a shared prefix to a later sequence", () => {
    const cache = new KvCache({ numBlocks: 64, blockSize: BS });
    const shared = seqTokens(64);
    expect(run(cache, "a", [...shared, ...seqTokens(10, 1000)])).toBe(0);
    cache.free("a");
    expect(run(cache, "b", [...shared, ...seqTokens(10, 2000)])).toBe(64);
    expect(cache.prefixQueries).toBe(148);
    expect(cache.prefixHits).toBe(64);
  });

  it("counts only whole blocks as hits", () => {
    const cache = new KvCache({ numBlocks: 64, blockSize: BS });
    run(cache, "a", seqTokens(40));
    expect(cache.lookup("m", [...seqTokens(40), 99]).tokens).toBe(32);
  });

  it("always leaves the last prompt token to compute, even when every block is cached", () => {
    const cache = new KvCache({ numBlocks: 64, blockSize: BS });
    run(cache, "a", seqTokens(64));
    expect(cache.lookup("m", seqTokens(64)).tokens).toBe(48);
    expect(cache.lookup("m", seqTokens(65)).tokens).toBe(64);
  });

  it("does not hit the same block content after a different prefix (chained hashes)", () => {
    const cache = new KvCache({ numBlocks: 64, blockSize: BS });
    const block = seqTokens(BS, 500);
    run(cache, "a", [...seqTokens(BS, 0), ...block, 1]);
    expect(cache.lookup("m", [...seqTokens(BS, 100), ...block, 1]).tokens).toBe(0);
    expect(cache.blockHashes("m", [...seqTokens(BS, 0), ...block])[1]).not.toBe(
      cache.blockHashes("m", [...seqTokens(BS, 100), ...block])[1],
    );
  });

  it("keeps the prefix cache of each model apart", () => {
    const cache = new KvCache({ numBlocks: 64, blockSize: BS });
    run(cache, "a", seqTokens(33), "model-a");
    expect(cache.lookup("model-a", seqTokens(33)).tokens).toBe(32);
    expect(cache.lookup("model-b", seqTokens(33)).tokens).toBe(0);
  });

  it("reference-counts shared blocks and frees them only when the last holder leaves", () => {
    const cache = new KvCache({ numBlocks: 16, blockSize: BS });
    const prompt = seqTokens(33);
    run(cache, "a", prompt);
    run(cache, "b", prompt);
    const [first] = cache.blocksOf("a");
    expect(first).toBeDefined();
    expect(cache.blocksOf("b")[0]).toBe(first);
    expect(cache.refCount(first ?? -1)).toBe(2);
    cache.free("a");
    expect(cache.refCount(first ?? -1)).toBe(1);
    cache.free("b");
    expect(cache.refCount(first ?? -1)).toBe(0);
    expect(cache.referencedBlocks).toBe(0);
    // Freed but still cached: a third request reuses it.
    expect(run(cache, "c", prompt)).toBe(32);
    checkInvariants(cache);
  });

  it("evicts the least recently used unreferenced block first", () => {
    const cache = new KvCache({ numBlocks: 4, blockSize: BS });
    run(cache, "a", seqTokens(BS, 0)); // one full block each
    run(cache, "b", seqTokens(BS, 100));
    run(cache, "c", seqTokens(BS, 200));
    cache.free("b");
    cache.free("a");
    cache.free("c");
    const [bBlock, aBlock, cBlock] = cache.evictionOrder();
    expect(cache.blocksOf("a")).toEqual([]);
    // Reusing "b" makes it the most recently used once it is freed again.
    expect(run(cache, "b2", [...seqTokens(BS, 100), 7])).toBe(BS);
    cache.free("b2");
    // Two new blocks: one empty block, then the LRU cached block ("a").
    run(cache, "d", seqTokens(2 * BS, 900));
    expect(cache.lookup("m", [...seqTokens(BS, 0), 1]).tokens).toBe(0);
    expect(cache.lookup("m", [...seqTokens(BS, 200), 1]).tokens).toBe(BS);
    expect(cache.lookup("m", [...seqTokens(BS, 100), 1]).tokens).toBe(BS);
    expect(cache.blocksOf("d")).toContain(aBlock);
    expect(cache.evictionOrder()).toEqual(expect.arrayContaining([cBlock, bBlock]));
    expect(cache.evictions).toBe(1);
  });

  it("reports an allocation that does not fit as a value and allocates nothing", () => {
    const cache = new KvCache({ numBlocks: 4, blockSize: BS });
    run(cache, "a", seqTokens(3 * BS));
    const result = cache.allocate("b", "m", 2 * BS);
    expect(result).toEqual({ ok: false, reason: "out_of_blocks", needed: 2, available: 1 });
    expect(cache.blocksOf("b")).toEqual([]);
    expect(cache.referencedBlocks).toBe(3);
  });

  it("never holds more blocks than its capacity under churn", () => {
    const cache = new KvCache({ numBlocks: 32, blockSize: BS });
    const live: string[] = [];
    for (let i = 0; i < 500; i++) {
      const id = `s${i}`;
      const tokens = [...seqTokens(BS * (i % 3), 0), ...seqTokens(1 + ((i * 37) % 90), i * 1000)];
      const hit = cache.lookup("m", tokens);
      const result = cache.allocate(id, "m", tokens.length, hit, tokens.length);
      if (result.ok) {
        cache.commit(id, tokens, tokens.length);
        live.push(id);
      }
      if (!result.ok || live.length > 3) cache.free(live.shift() ?? "");
      checkInvariants(cache);
    }
    for (const id of live) cache.free(id);
    expect(cache.referencedBlocks).toBe(0);
    expect(cache.sequences).toBe(0);
  });

  it("grows a sequence block by block as its tokens are computed", () => {
    const cache = new KvCache({ numBlocks: 8, blockSize: BS });
    expect(cache.allocate("a", "m", 10)).toEqual({ ok: true, newBlocks: 1 });
    expect(cache.allocate("a", "m", 16)).toEqual({ ok: true, newBlocks: 0 });
    expect(cache.allocate("a", "m", 17)).toEqual({ ok: true, newBlocks: 1 });
    expect(cache.blocksOf("a")).toHaveLength(2);
  });
});
