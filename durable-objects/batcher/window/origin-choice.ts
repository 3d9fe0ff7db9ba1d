/**
 * Origin choice by load inside one Batcher (docs/batching.md, "The window"): which usable
 * origin gets the next batch, least loaded first. Prefix affinity is the router's
 * (`../routing/`): the origin it placed the head on goes first, and this choice applies
 * when it placed none or that origin cannot take the batch.
 */

/** What the batcher knows about one healthy origin when it places a batch. */
export interface OriginCandidate {
  id: string;
  /** Sequences the origin runs or queues, by its last report plus what we sent since. */
  load: number;
  /** Start slots left (`max_num_seqs` minus load), or null when the origin never reported. */
  freeSlots: number | null;
  /**
   * Sequences it may still be sent before its engine queues more than `maxOriginQueue`
   * beyond its slots, or null when unknown (no trusted report, or no slot count in it).
   */
  room: number | null;
  /** Prompt tokens its KV cache can still take, or null when unknown (no fresh report). */
  kvRoomTokens: number | null;
  /** Items this batcher has sent the origin that have not finished. */
  inFlight: number;
  /** What its fresh load report says of its engine; absent without one. */
  engine?: {
    maxNumSeqs: number;
    stepMs: number;
    prefillTokensPerMs: number | null;
    /** Prompt tokens it reported still to prefill (null: it does not say), and when. */
    prefillBacklogTokens: number | null;
    reportedAt: number;
    /**
     * Sequences it runs, queues or holds, batch lines included (which `load` leaves out:
     * the origin stops them for interactive requests); what the batch lane fills up to.
     */
    batchLoad: number;
    /** Most batch lines it runs at once, by its report (null: it does not say). */
    backgroundCap: number | null;
  };
}

/** The request a batch is being opened for (the head of the queue). */
export interface PlacementRequest {
  id: string;
  lane: number;
  promptTokens: number;
  /** The origin the router placed it on, if it did. */
  target?: string;
}

/** Picks the origin for a batch whose first item is `head`, or null when none can hold it. */
export type OriginChooser = (
  candidates: readonly OriginCandidate[],
  head: PlacementRequest,
) => string | null;

/** True when the origin's KV cache can take `promptTokens` more prompt tokens. */
export function fitsKv(candidate: OriginCandidate, promptTokens: number): boolean {
  return candidate.kvRoomTokens === null || candidate.kvRoomTokens >= promptTokens;
}

/**
 * Least loaded origin that can hold the head's prompt: fewest sequences, then most KV room,
 * then configuration order (the window's default chooser).
 */
export const chooseLeastLoaded: OriginChooser = (candidates, head) => {
  let best: OriginCandidate | null = null;
  for (const candidate of candidates) {
    if (!fitsKv(candidate, head.promptTokens)) continue;
    if (best === null || ranksBefore(candidate, best)) best = candidate;
  }
  return best === null ? null : best.id;
};

/**
 * {@link chooseLeastLoaded}, with full ties going to the origin this batcher sent to
 * longest ago (never sent first), so idle origins take turns instead of the first in
 * configuration order taking every request of a quiet period. `lastSentAt` is the
 * caller's own record (ms, or null for never); the choice stays a pure function of it.
 */
export function chooseLeastLoadedInTurn(
  lastSentAt: (originId: string) => number | null,
): OriginChooser {
  return (candidates, head) => {
    let best: OriginCandidate | null = null;
    for (const candidate of candidates) {
      if (!fitsKv(candidate, head.promptTokens)) continue;
      if (best === null) {
        best = candidate;
        continue;
      }
      const order = compare(candidate, best);
      if (order < 0 || (order === 0 && sentEarlier(candidate.id, best.id, lastSentAt))) {
        best = candidate;
      }
    }
    return best === null ? null : best.id;
  };
}

function sentEarlier(
  a: string,
  b: string,
  lastSentAt: (originId: string) => number | null,
): boolean {
  const sentA = lastSentAt(a) ?? Number.NEGATIVE_INFINITY;
  const sentB = lastSentAt(b) ?? Number.NEGATIVE_INFINITY;
  return sentA < sentB;
}

function ranksBefore(a: OriginCandidate, b: OriginCandidate): boolean {
  return compare(a, b) < 0;
}

/** Negative when `a` ranks before `b`: fewer sequences, then more KV room; 0 on a tie. */
function compare(a: OriginCandidate, b: OriginCandidate): number {
  if (a.load !== b.load) return a.load - b.load;
  // Unknown KV room counts as the most room: an origin that never reported is idle to us.
  const roomA = a.kvRoomTokens ?? Number.POSITIVE_INFINITY;
  const roomB = b.kvRoomTokens ?? Number.POSITIVE_INFINITY;
  if (roomA === roomB) return 0;
  return roomA > roomB ? -1 : 1;
}
