/**
 * The `breakers` section of `WARMGATE_CONFIG`: how origins' circuit breakers trip, cool
 * down and are probed, resolved with every default (docs/configuration.md, "Breakers";
 * the settings' meaning: docs/failover.md).
 */
import { z } from "zod";

/** The `breakers` section as written, resolved to whether they apply and their settings. */
export const BreakersSchema = z
  .strictObject({
    /** Breakers on or off: with them off, only the quarantine applies. */
    enabled: z.boolean().default(true),
    /** Failures in a row that open a breaker. */
    consecutive_failures: z.int().min(1).max(1000).default(5),
    /** Share of failures in the window that opens it, once the window has `min_requests`. */
    failure_ratio: z.number().gt(0).max(1).default(0.5),
    min_requests: z.int().min(1).default(20),
    window_ms: z.int().min(100).max(600_000).default(10_000),
    /** A first byte slower than this counts as a failure (a frozen origin is found by it). */
    slow_first_byte_ms: z.int().min(1).max(600_000).default(2_000),
    /**
     * How long a breaker stays open the first time, and the pace of probes while it is down;
     * doubled at each trip by live traffic.
     */
    cooldown_ms: z.int().min(100).max(3_600_000).default(5_000),
    /** Longest cooldown (never below `cooldown_ms`). */
    max_cooldown_ms: z.int().min(100).max(86_400_000).default(120_000),
    /** Health probes in a row that close a half-open breaker. */
    probes: z.int().min(1).max(100).default(2),
    /**
     * Most of a region's origins that may be open at once, as a share, and at least one
     * (Envoy's `max_ejection_percent`): no kind of failure empties a pool of several.
     */
    max_ejection_share: z.number().min(0).max(1).default(0.5),
  })
  .transform((breakers) => ({
    enabled: breakers.enabled,
    /** How breakers trip, recover and are probed. */
    settings: {
      consecutiveFailures: breakers.consecutive_failures,
      failureRatio: breakers.failure_ratio,
      minRequests: breakers.min_requests,
      windowMs: breakers.window_ms,
      slowFirstByteMs: breakers.slow_first_byte_ms,
      cooldownMs: breakers.cooldown_ms,
      maxCooldownMs: Math.max(breakers.cooldown_ms, breakers.max_cooldown_ms),
      probes: breakers.probes,
      maxEjectionShare: breakers.max_ejection_share,
    },
  }));

/** Whether breakers apply, and their settings. */
export type Breakers = z.output<typeof BreakersSchema>;
/** How breakers trip, recover and are probed, every default applied. */
export type BreakerSettings = Breakers["settings"];

/** The settings of a configuration that sets none: the section's defaults. */
export const DEFAULT_BREAKER_SETTINGS: Readonly<BreakerSettings> = BreakersSchema.parse(
  {},
).settings;
