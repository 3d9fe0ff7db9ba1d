/**
 * The `limits` section of `WARMGATE_CONFIG`: request size, timeouts and retries, resolved
 * with every default (docs/configuration.md, "Limits").
 */
import { z } from "zod";

/** Request limits as written, resolved to what the edge runs with. */
export const LimitsSchema = z
  .strictObject({
    /** Request body limit; 8 MiB matches OpenAI's documented request size cap. */
    max_body_bytes: z
      .int()
      .positive()
      .default(8 * 1024 * 1024),
    /** Give up on an origin that has not started answering. */
    first_byte_timeout_ms: z.int().positive().default(30_000),
    /** Give up on a request altogether. */
    request_timeout_ms: z.int().positive().default(600_000),
    /** Extra origins tried after the first fails before any byte reached the client. */
    retry_budget: z.int().min(0).max(10).default(2),
    /** Retries an isolate makes at most, as a share of its requests over 10 s... */
    retry_ratio: z.number().min(0).max(10).default(0.1),
    /** ...plus this many, however few requests there were. */
    retry_floor: z.int().min(0).max(100_000).default(10),
  })
  .transform((limits) => ({
    maxBodyBytes: limits.max_body_bytes,
    firstByteTimeoutMs: limits.first_byte_timeout_ms,
    requestTimeoutMs: limits.request_timeout_ms,
    retryBudget: limits.retry_budget,
    retryRatio: limits.retry_ratio,
    retryFloor: limits.retry_floor,
  }));

/** Request limits, every default applied. */
export type Limits = z.output<typeof LimitsSchema>;
