/**
 * The placement decision (docs/routing.md, "Placement"): a predicted time to first token
 * per origin from its queue, its uncached share of the prompt and its decode load; the
 * warmest origin unless it is much slower than the best, its prefix's traffic exceeds its
 * holders' bounded share (a copy), or another's cost is lower by a margin; a cold prefix on
 * its consistent-hash origin under a bound on load. Pure: the same inputs give the same
 * origin on every edge and Batcher shard.
 */
import type { RouterSettings } from "../../../contracts/config/routing.ts";

/** What the router knows of one origin it may place on. */
export interface RouteCandidate {
  id: string;
  /** Sequences it runs or queues (last report plus what was sent since). */
  load: number;
  /** Sequences its engine runs at once, when reported. */
  maxNumSeqs: number | null;
  /** Its engine's recent step time, ms (0 when unknown). */
  stepMs: number;
  /** Its reported prefill speed, prompt tokens per ms, or null. */
  prefillTokensPerMs: number | null;
  /** Uncached prompt tokens placed on it whose first token has not come yet. */
  backlogTokens: number;
  /** Prompt tokens its KV cache can still take, or null when unknown. */
  kvRoomTokens: number | null;
}

/** Why a request went where it went. */
export type PlacementReason = "cache_hit" | "session" | "cold" | "spread" | "pinned" | "fallback";

/** Every reason, in the order the admin view lists them. */
export const PLACEMENT_REASONS: readonly PlacementReason[] = [
  "cache_hit",
  "session",
  "cold",
  "spread",
  "pinned",
  "fallback",
];

/** A request as placement sees it. */
export interface PlacementInput {
  /** Its prefix blocks' chain hashes. */
  blocks: ArrayLike<number>;
  /** Its prompt tokens as the edge estimates them. */
  promptTokens: number;
  /** The key cold placement hashes: a session, else its first blocks (see `coldKey`). */
  coldKey: number;
  /** Leading blocks each candidate holds, by candidate. */
  matched: readonly number[];
  /**
   * Prompt tokens each candidate's cache takes before it evicts, by candidate (null or
   * absent: unbounded).
   */
  freeTokens?: readonly (number | null)[];
  /** The origin its session last went to, when it has one. */
  sessionOrigin: string | null;
  /**
   * Requests in flight (placed, not ended) whose first `depth` blocks are this one's, this
   * one not counted: the traffic of a prefix (absent: none).
   */
  sharing?: (depth: number) => number;
}

/** Where a request goes and what was predicted for it there. */
export interface PlacementChoice {
  origin: string;
  reason: PlacementReason;
  /** Leading blocks the origin was expected to hold. */
  matchedBlocks: number;
  predictedTtftMs: number;
}

/** Predicted time to first token on `c` for a prompt of which `uncached` tokens need a prefill. */
export function predictTtftMs(c: RouteCandidate, uncached: number, s: RouterSettings): number {
  const rate = c.prefillTokensPerMs ?? s.prefillTokensPerMs;
  const step = c.stepMs > 0 ? c.stepMs : 1;
  // Sequences beyond the engine's slots wait for others to finish: about a few steps each.
  const slots = c.maxNumSeqs ?? Number.POSITIVE_INFINITY;
  const excess = Math.max(0, c.load + 1 - slots);
  return (c.backlogTokens + uncached) / rate + step * (1 + 4 * excess);
}

/** Uncached prompt tokens when `matched` of `blocks` leading blocks are cached. */
export function uncachedTokens(promptTokens: number, blocks: number, matched: number): number {
  if (blocks === 0) return promptTokens;
  return Math.max(1, Math.round(promptTokens * (1 - matched / blocks)));
}

/**
 * The placement among `candidates` (non-empty). The warmest origin (at least
 * `minMatchBlocks`) keeps the request unless its predicted TTFT is above the best's by more
 * than `spreadRatio` and `spreadMs` (the queue rule), or another origin's load, counting as
 * load the prefill the request would redo there and what it would evict, is lower by more
 * than `balanceSeqs` while the warm origin carries `loadBound` times the mean or would
 * evict where the other would not (the balance rule): then the prefix spreads. Else the
 * session's origin on the same terms; else the first origin in the cold key's rendezvous
 * order under `loadBound` times the mean load, whose TTFT is within `tieMs` of the best and
 * whose cache has room when any has.
 */
export function choosePlacement(
  candidates: readonly RouteCandidate[],
  input: PlacementInput,
  s: RouterSettings,
): PlacementChoice {
  const n = input.blocks.length;
  const need = candidates.map((_, i) =>
    uncachedTokens(input.promptTokens, n, input.matched[i] ?? 0),
  );
  const ttft = candidates.map((c, i) => predictTtftMs(c, need[i] ?? 0, s));
  const fits = candidates.map(
    (c, i) => c.kvRoomTokens === null || c.kvRoomTokens >= (need[i] ?? 0),
  );
  const anyFits = fits.some(Boolean);
  const usable = (i: number) => fits[i] === true || !anyFits;
  // Prompt tokens its new blocks would push out of each cache, as far as the index follows it.
  const evicted = candidates.map((_, i) => {
    const free = input.freeTokens?.[i] ?? null;
    return free === null ? 0 : Math.max(0, (need[i] ?? 0) - free);
  });
  const order = rendezvousOrder(candidates, input.coldKey);
  let best = -1;
  for (const i of order) {
    if (!usable(i)) continue;
    if (best < 0 || (ttft[i] as number) < (ttft[best] as number)) best = i;
  }
  const bestTtft = ttft[best] as number;
  const choice = (i: number, reason: PlacementReason): PlacementChoice => ({
    origin: (candidates[i] as RouteCandidate).id,
    reason,
    matchedBlocks: input.matched[i] ?? 0,
    predictedTtftMs: ttft[i] as number,
  });
  const load = (i: number) => (candidates[i] as RouteCandidate).load;
  const rate = (i: number) =>
    (candidates[i] as RouteCandidate).prefillTokensPerMs ?? s.prefillTokensPerMs;
  const total = candidates.reduce((sum, c) => sum + c.load, 0);
  const mean = (total + 1) / candidates.length;
  const coldBound = Math.ceil(s.loadBound * mean);
  const heavy = (i: number) => load(i) >= s.loadBound * mean && load(i) - mean > s.balanceSeqs;
  const fast = (i: number) => (ttft[i] as number) <= bestTtft * (1 + s.spreadRatio) + s.spreadMs;
  const closeEnough = (i: number) => fits[i] === true && !heavy(i) && fast(i);

  // What a placement costs an origin, in prompt tokens: the prefill queued there and its
  // own, what it pushes out of the cache, and the sequences it joins.
  const cost = (i: number) =>
    (candidates[i] as RouteCandidate).backlogTokens +
    (need[i] as number) +
    s.evictionWeight * (evicted[i] as number) +
    s.moveTokensPerSeq * load(i);
  let warm = -1;
  for (const i of order) {
    const m = input.matched[i] ?? 0;
    if (m < Math.min(s.minMatchBlocks, n)) continue;
    // Of origins holding as much, the cheapest (load reports are the same on every
    // router), then the first in rendezvous order.
    const held = input.matched[warm] ?? 0;
    const cheaper = warm >= 0 && cost(i) < cost(warm);
    if (warm < 0 || m > held || (m === held && cheaper)) warm = i;
  }
  if (warm >= 0 && n > 0) {
    // A queue every origin shares is no reason to copy: the copy's prefill lengthens another.
    if (!fits[warm] || (!fast(warm) && load(warm) >= s.loadBound * mean)) return spread(warm);
    const copy = replicate(warm);
    if (copy >= 0) return choice(copy, "spread");
    const other = rebalance(warm);
    if (other < 0) return choice(warm, "cache_hit");
    // A move to an origin that holds as much (a copy) is a hit all the same.
    const held = (input.matched[other] ?? 0) >= (input.matched[warm] ?? 0);
    return choice(other, held ? "cache_hit" : "spread");
  }

  if (input.sessionOrigin !== null) {
    const at = candidates.findIndex((c) => c.id === input.sessionOrigin);
    if (at >= 0 && closeEnough(at)) return choice(at, "session");
  }

  // Cold: the first origin in the key's rendezvous order that is under the bound, whose cost
  // is within `tieMs` of prefill of the cheapest's and (when any is) evicts nothing, so that
  // edges and Batcher shards that share nothing (their backlogs and loads come from the same
  // load reports) place a new prefix alike. The cost counts the sequences a prefill there
  // would hold up, so a new prefix goes where it delays the fewest.
  let cheapest = Number.POSITIVE_INFINITY;
  for (let i = 0; i < candidates.length; i++) if (usable(i)) cheapest = Math.min(cheapest, cost(i));
  const tied = (i: number) => cost(i) <= cheapest + s.tieMs * rate(i);
  const roomy = evicted.some((e) => e === 0);
  for (const i of order) {
    if (fits[i] === true && load(i) < coldBound && tied(i) && (!roomy || evicted[i] === 0))
      return choice(i, "cold");
  }
  for (const i of order) {
    if (fits[i] === true && load(i) < coldBound && tied(i)) return choice(i, "cold");
  }
  return choice(best, "spread");

  /**
   * The balance rule, as the SGLang router's balance thresholds with the prefill a move
   * costs as hysteresis: the candidate of the lowest cost (load, and in sequences of
   * `moveTokensPerSeq` the prompt tokens queued ahead, to prefill and to evict) takes the
   * request when its cost is `balanceSeqs` sequences below the warm origin's and the warm
   * origin would evict where it would not, or is crowded and the prefix is shared or the
   * move does not delay its first token; -1: the warm origin keeps it.
   */
  function rebalance(from: number): number {
    let pick = -1;
    for (const i of order) {
      if (i === from || !usable(i)) continue;
      if (pick < 0 || cost(i) < cost(pick)) pick = i;
    }
    if (pick < 0 || cost(from) - cost(pick) <= s.balanceSeqs * s.moveTokensPerSeq) return -1;
    if ((evicted[from] as number) > (evicted[pick] as number)) return pick;
    // A prefix no other request in flight shares (a session's own history) serves no one else
    // once copied: it moves for load only where it starts no later, or a session would redo
    // its history's prefill to relieve one sequence.
    const lone = (input.sharing?.(input.matched[from] ?? 0) ?? 0) === 0;
    if (lone && (ttft[pick] as number) > (ttft[from] as number)) return -1;
    return load(from) >= s.loadBound * mean ? pick : -1;
  }

  /**
   * The hot-prefix rule: a prefix whose requests in flight, this one included, exceed
   * `loadBound` times one origin's share of all the load on each origin holding it (or the
   * mean, while an origin that does not hold it carries at most `leftOutShare` of it), and
   * `balanceSeqs` each, is copied to the origin that holds it not whose load, counting the
   * prefill and eviction the copy costs, is lowest; -1: it has holders enough.
   */
  function replicate(from: number): number {
    const depth = input.matched[from] ?? 0;
    const traffic = 1 + (input.sharing?.(depth) ?? 0);
    let holders = 0;
    for (let i = 0; i < candidates.length; i++) {
      if (usable(i) && (input.matched[i] ?? 0) >= depth) holders += 1;
    }
    const perHolder = traffic / holders;
    // Within the bound, seven holders of eight each carry 8/7 of an even share and the eighth
    // idles: an origin left out that carries at most `leftOutShare` of the mean gets a copy
    // once each holder's share of the prefix is above the mean. Its queued prefill counts as
    // load: one busy with new prompts runs few streams but is not idle.
    let lightest = Number.POSITIVE_INFINITY;
    for (let i = 0; i < candidates.length; i++) {
      if (!usable(i) || (input.matched[i] ?? 0) >= depth) continue;
      const queued = (candidates[i] as RouteCandidate).backlogTokens / s.moveTokensPerSeq;
      lightest = Math.min(lightest, load(i) + queued);
    }
    const leftOut = perHolder > mean && lightest <= s.leftOutShare * mean;
    if (perHolder <= s.balanceSeqs || (perHolder <= s.loadBound * mean && !leftOut)) return -1;
    let pick = -1;
    for (const i of order) {
      if (!usable(i) || (input.matched[i] ?? 0) >= depth) continue;
      if (pick < 0 || cost(i) < cost(pick)) pick = i;
    }
    return pick;
  }

  function spread(from: number): PlacementChoice {
    // Among the origins close to the best, the warmest: a hot prefix spreads to as few
    // origins as keep its time to first token low.
    let pick = best;
    for (const i of order) {
      if (closeEnough(i) && (input.matched[i] ?? 0) > (input.matched[pick] ?? 0)) pick = i;
    }
    return choice(pick, pick === from ? "cache_hit" : "spread");
  }
}

/** Candidate positions by rendezvous (highest random weight) hashing of `key`. */
export function rendezvousOrder(candidates: readonly { id: string }[], key: number): number[] {
  const weights = candidates.map((c) => mix32(key ^ originHash(c.id)));
  return candidates
    .map((_, i) => i)
    .sort((a, b) => (weights[b] as number) - (weights[a] as number));
}

const originHashes = new Map<string, number>();

function originHash(id: string): number {
  let hash = originHashes.get(id);
  if (hash === undefined) {
    hash = 0x811c9dc5;
    for (let i = 0; i < id.length; i++) hash = Math.imul(hash ^ id.charCodeAt(i), 0x01000193);
    hash = mix32(hash);
    originHashes.set(id, hash);
  }
  return hash;
}

/** Murmur3's finalizer: a 32-bit value whose bits all depend on every input bit. */
export function mix32(value: number): number {
  let h = value | 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}
