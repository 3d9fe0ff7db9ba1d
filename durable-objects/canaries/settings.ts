/**
 * The `canaries` section of `WARMGATE_CONFIG` (docs/failover.md, "Canaries"): for a model,
 * the origins of its canary pool, the share of its traffic they take, and the thresholds
 * past which the canary is rolled back. The edge validates it and sends the spec along.
 */
import { z } from "zod";
import type { CanarySpec } from "../../contracts/canary.ts";

export const CanaryConfigSchema = z.strictObject({
  model: z.string().min(1).max(128),
  /** Origin ids of the canary pool; every other origin serving the model is the baseline. */
  origins: z.array(z.string().min(1).max(128)).min(1),
  /** Share of the model's requests sent to the pool while the canary runs (0.05: 5%). */
  weight: z.number().gt(0).max(1),
  /** Requests each arm needs before they are compared (default 50). */
  min_requests: z.int().min(1).max(1_000).optional(),
  /** Largest error rate above the baseline's before a rollback (default 0.05). */
  max_error_rate_increase: z.number().min(0).max(1).optional(),
  /** Largest TTFT p95 as a multiple of the baseline's before a rollback (default 1.5). */
  max_ttft_p95_ratio: z.number().min(1).max(100).optional(),
});
export type CanaryConfig = z.infer<typeof CanaryConfigSchema>;

export function canarySpecOf(config: CanaryConfig): CanarySpec {
  return {
    model: config.model,
    origins: [...config.origins],
    weight: config.weight,
    minRequests: config.min_requests ?? 50,
    maxErrorRateIncrease: config.max_error_rate_increase ?? 0.05,
    maxTtftP95Ratio: config.max_ttft_p95_ratio ?? 1.5,
  };
}
