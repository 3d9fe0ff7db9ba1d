/**
 * The `canaries` section of `WARMGATE_CONFIG`: for a model, the origins of its canary pool,
 * the share of its traffic they take, and the thresholds past which the canary is rolled
 * back, resolved with every default (docs/configuration.md, "Canaries"; docs/failover.md).
 */
import { z } from "zod";
import { ConfigIdSchema } from "./models.ts";

/** One canary as written, resolved to the spec the edge sends with its reports. */
export const CanarySchema = z
  .strictObject({
    model: ConfigIdSchema,
    /** Origin ids of the canary pool; every other origin serving the model is the baseline. */
    origins: z.array(ConfigIdSchema).min(1),
    /** Share of the model's requests sent to the pool while the canary runs (0.05: 5%). */
    weight: z.number().gt(0).max(1),
    /** Requests each arm needs before the arms are compared. */
    min_requests: z.int().min(1).max(1_000).default(50),
    /** Largest error rate the canary may have above the baseline's (0.05: five points). */
    max_error_rate_increase: z.number().min(0).max(1).default(0.05),
    /** Largest TTFT p95 the canary may have, as a multiple of the baseline's. */
    max_ttft_p95_ratio: z.number().min(1).max(100).default(1.5),
  })
  .transform((canary) => ({
    model: canary.model,
    origins: canary.origins,
    weight: canary.weight,
    minRequests: canary.min_requests,
    maxErrorRateIncrease: canary.max_error_rate_increase,
    maxTtftP95Ratio: canary.max_ttft_p95_ratio,
  }));

/** A configured canary, as the edge sends it along with its reports. */
export type CanarySpec = z.output<typeof CanarySchema>;
