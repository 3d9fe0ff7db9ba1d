/**
 * The `routing` section of `WARMGATE_CONFIG`: routing to warm prefix caches, resolved with
 * every default (docs/configuration.md, "Routing"; the settings' meaning: docs/routing.md).
 */
import { z } from "zod";

/** Most origins a region may have where routing is on (the index keeps one bit each). */
export const MAX_ROUTED_ORIGINS = 32;

/** The `routing` section as written, resolved to whether it is on and the router settings. */
export const RoutingSchema = z
  .strictObject({
    /** Route each request to the origin whose prefix cache is warm for it. */
    enabled: z.boolean().default(true),
    /** Fewest leading blocks (16 tokens each) that make an origin's match worth keeping. */
    min_match_blocks: z.int().min(1).max(1024).default(4),
    /**
     * A warm origin keeps its prefixes until its predicted time to first token exceeds the
     * best origin's by this share plus `spread_ms`; past it, if the origin carries
     * `load_bound` times the mean load, the prefix spreads.
     */
    spread_ratio: z.number().min(0).max(100).default(1),
    spread_ms: z.number().min(0).max(60_000).default(100),
    /**
     * A cold prefix's consistent-hash origin is skipped above this multiple of the mean load;
     * a warm origin below it moves a request for the balance rule only to evict less; a
     * prefix whose requests in flight exceed it per origin holding it is copied.
     */
    load_bound: z.number().min(1).max(10).default(1.25),
    /**
     * A prefix whose holders each carry more than the mean load of it is copied to an origin
     * that does not hold it and carries at most this share of the mean.
     */
    left_out_share: z.number().min(0).max(1).default(0.5),
    /**
     * Sequences by which another origin's cost must be below a warm origin's before its
     * prefix spreads there (hysteresis), and fewest requests in flight per origin holding a
     * prefix before it is copied.
     */
    balance_seqs: z.number().min(0).max(10_000).default(2),
    /** Prompt tokens of prefill one sequence of load weighs in a placement's cost. */
    move_tokens_per_seq: z.number().positive().max(1_000_000).default(256),
    /** Share of a prefill each prompt token pushed out of a full cache costs a move. */
    eviction_weight: z.number().min(0).max(100).default(1),
    /** Cold placements whose cost is within this much prefill (ms) of the cheapest are equal. */
    tie_ms: z.number().min(0).max(60_000).default(10),
    /** Prefill speed assumed for an origin that reports none (prompt tokens per second). */
    prefill_tokens_per_s: z.number().positive().default(10_000),
    /** Most prefix blocks remembered per origin (a bound on memory). */
    max_index_blocks: z.int().min(16).max(1_048_576).default(65_536),
  })
  .transform((routing) => ({
    enabled: routing.enabled,
    /** What a router runs with. */
    settings: {
      minMatchBlocks: routing.min_match_blocks,
      spreadRatio: routing.spread_ratio,
      spreadMs: routing.spread_ms,
      loadBound: routing.load_bound,
      leftOutShare: routing.left_out_share,
      balanceSeqs: routing.balance_seqs,
      moveTokensPerSeq: routing.move_tokens_per_seq,
      evictionWeight: routing.eviction_weight,
      tieMs: routing.tie_ms,
      prefillTokensPerMs: routing.prefill_tokens_per_s / 1000,
      maxIndexBlocks: routing.max_index_blocks,
    },
  }));

/** The `routing` section as an operator writes it (every field optional). */
export type RoutingSection = z.input<typeof RoutingSchema>;
/** What a router runs with, every default applied. */
export type RouterSettings = z.output<typeof RoutingSchema>["settings"];
