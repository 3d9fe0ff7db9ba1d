/**
 * The placement decision (docs/routing.md, "Placement"): one cost per origin, in ms of its
 * engine time, from the prefill the request still needs there and the prefill queued ahead,
 * the load the origin already carries (decode included) and what the request's new blocks
 * would push out of its cache; the lowest wins, equal ones by the prefix's rendezvous order.
 * Pure: the same inputs give the same origin on every edge and Batcher shard.
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
  /** The key equal costs are settled by: a session, else its first blocks (see `coldKey`). */
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
}

/** Where a request goes and what was predicted for it there. */
export interface PlacementChoice {
  origin: string;
  reason: PlacementReason;
  /** Leading blocks the origin was expected to hold. */
  matchedBlocks: number;
  predictedTtftMs: number;
}

/** What placing a request on one candidate costs, in ms of that origin's engine time. */
export interface PlacementCost {
  /** Prompt tokens it would prefill there. */
  uncached: number;
  /** Its predicted time to first token: the prefill queued ahead, its own, one step. */
  ttftMs: number;
  /** The load the origin already carries: `seqCostSteps` steps per even share of the region's. */
  loadMs: number;
  /** Its own prefill again, times `prefillWeight`: work added to the region. */
  workMs: number;
  /** The prefill of what its new blocks push out of a full cache, times `evictionWeight`. */
  evictionMs: number;
  total: number;
}

/**
 * The cost of placing a prompt of which `uncached` tokens need a prefill on `c`, whose
 * cache takes `freeTokens` more before it evicts (null: unbounded), where an even share of
 * the region's load is `share` sequences.
 */
export function placementCost(
  c: RouteCandidate,
  uncached: number,
  freeTokens: number | null,
  share: number,
  s: RouterSettings,
): PlacementCost {
  const rate = c.prefillTokensPerMs ?? s.prefillTokensPerMs;
  // The reported step is a recent mean, longer while the engine decodes many sequences:
  // the same queue weighs more on a busy origin.
  const step = c.stepMs > 0 ? c.stepMs : s.stepMs;
  const ttftMs = (c.backlogTokens + uncached) / rate + step;
  const loadMs = (s.seqCostSteps * step * c.load) / share;
  const workMs = (s.prefillWeight * uncached) / rate;
  const evicted = freeTokens === null ? 0 : Math.max(0, uncached - freeTokens);
  const evictionMs = (s.evictionWeight * evicted) / rate;
  return {
    uncached,
    ttftMs,
    loadMs,
    workMs,
    evictionMs,
    total: ttftMs + loadMs + workMs + evictionMs,
  };
}

/** Uncached prompt tokens when `matched` of `blocks` leading blocks are cached. */
export function uncachedTokens(promptTokens: number, blocks: number, matched: number): number {
  if (blocks === 0) return promptTokens;
  return Math.max(1, Math.round(promptTokens * (1 - matched / blocks)));
}

/**
 * The placement among `candidates` (non-empty): the lowest {@link placementCost}, among
 * those whose KV room takes the request when any does. Costs within `tieMs` of the lowest
 * are equal: of those, the warmest, then the session's origin, then the first in the cold
 * key's rendezvous order. A match shorter than `minMatchBlocks` counts as none.
 */
export function choosePlacement(
  candidates: readonly RouteCandidate[],
  input: PlacementInput,
  s: RouterSettings,
): PlacementChoice {
  const n = input.blocks.length;
  const least = Math.min(s.minMatchBlocks, n);
  const matched = candidates.map((_, i) => {
    const m = input.matched[i] ?? 0;
    return n > 0 && m >= least ? m : 0;
  });
  // An even share of the load, counting this request: load weighs relative to it, so that
  // the same imbalance in sequences matters less the busier the region is.
  const share = Math.max(
    1,
    (candidates.reduce((sum, c) => sum + c.load, 0) + 1) / candidates.length,
  );
  const costs = candidates.map((c, i) =>
    placementCost(
      c,
      uncachedTokens(input.promptTokens, n, matched[i] ?? 0),
      input.freeTokens?.[i] ?? null,
      share,
      s,
    ),
  );
  const fits = candidates.map(
    (c, i) => c.kvRoomTokens === null || c.kvRoomTokens >= (costs[i]?.uncached ?? 0),
  );
  const anyFits = fits.some(Boolean);
  const usable = (i: number) => fits[i] === true || !anyFits;
  let lowest = Number.POSITIVE_INFINITY;
  for (const [i, cost] of costs.entries()) {
    if (usable(i)) lowest = Math.min(lowest, cost.total);
  }
  const tied = (i: number) => usable(i) && (costs[i]?.total ?? 0) <= lowest + s.tieMs;
  const session = candidates.findIndex((c) => c.id === input.sessionOrigin);
  // Of equal costs: the warmest (no copy), then the session's origin, then the rendezvous
  // order, the same on every router, so that a prefix whose traffic falls gathers back on
  // its first origin and its copies age out of the other caches.
  let pick = -1;
  for (const i of rendezvousOrder(candidates, input.coldKey)) {
    if (!tied(i)) continue;
    const m = matched[i] ?? 0;
    const held = pick < 0 ? -1 : (matched[pick] ?? 0);
    if (m > held || (m === 0 && held === 0 && i === session)) pick = i;
  }
  const warmest = Math.max(...matched);
  const got = matched[pick] ?? 0;
  let reason: PlacementReason = pick === session ? "session" : "cold";
  if (warmest > 0) reason = got === warmest ? "cache_hit" : "spread";
  return {
    origin: (candidates[pick] as RouteCandidate).id,
    reason,
    matchedBlocks: input.matched[pick] ?? 0,
    predictedTtftMs: (costs[pick] as PlacementCost).ttftMs,
  };
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
