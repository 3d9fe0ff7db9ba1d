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
     * Engine steps that an origin's load costs per even share of the region's load it
     * carries, weighed against the prefill a warm match saves: an origin at twice the mean
     * costs this many of its steps more than one at the mean (decode included: a step grows
     * with the sequences in it, so load weighs more on a busy origin).
     */
    seq_cost_steps: z.number().min(0).max(10_000).default(64),
    /**
     * Share of a prefill that each prompt token a placement pushes out of a full cache
     * costs: a block evicted now is prefilled again when its prefix comes back.
     */
    eviction_weight: z.number().min(0).max(100).default(1),
    /**
     * What each prompt token a placement has to prefill weighs beyond its own wait, as a
     * share of its prefill: it is work added to the region, which every request queued
     * behind it waits for too, where a backlog elsewhere only moves.
     */
    prefill_weight: z.number().min(0).max(100).default(4),
    /** Engine step assumed for an origin that reports none (ms). */
    step_ms: z.number().positive().max(10_000).default(20),
    /**
     * Placements whose costs are within this of the lowest are equal; of those, the first
     * in the prefix's rendezvous order wins, so routers that share nothing agree and a
     * prefix gathers back on its home origin when its traffic falls.
     */
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
      seqCostSteps: routing.seq_cost_steps,
      evictionWeight: routing.eviction_weight,
      prefillWeight: routing.prefill_weight,
      stepMs: routing.step_ms,
      tieMs: routing.tie_ms,
      prefillTokensPerMs: routing.prefill_tokens_per_s / 1000,
      maxIndexBlocks: routing.max_index_blocks,
    },
  }));

/** The `routing` section as an operator writes it (every field optional). */
export type RoutingSection = z.input<typeof RoutingSchema>;
/** What a router runs with, every default applied. */
export type RouterSettings = z.output<typeof RoutingSchema>["settings"];
