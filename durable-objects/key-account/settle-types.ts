/**
 * What a settlement tells a key's `KeyAccount` about how its client saw the request
 * (docs/key-account.md, "Keys and settlement"; docs/cache.md): part of the contract the
 * edge imports with `types.ts`.
 */

/**
 * How the edge's response cache served a request (docs/cache.md). A hit's `usage` is what
 * generating the answer cost, the tokens it saved: billed at `pricePpm` of its price, its
 * reserved tokens given back.
 */
export interface SettleCache {
  /** `hit`: answered from the cache; `miss`: looked up, then generated. */
  result: "hit" | "miss";
  /** Bytes a hit served. */
  bytes: number;
  /** Share of the answer's price a hit is billed at, in parts per million. */
  pricePpm: number;
}

/** A request as its client saw it: where it was served, its status and its timings. */
export interface SettleMetrics {
  /** The region that served it, or null when none did. */
  region: string | null;
  /** The HTTP status the client received. */
  status: number;
  /** From the edge receiving it to its settlement. */
  durationMs: number;
  /** From the edge receiving it to its first body byte, for a streamed answer; else null. */
  ttftMs: number | null;
}
