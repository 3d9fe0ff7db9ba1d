/**
 * The `breakers` section of `WARMGATE_CONFIG` (docs/failover.md, "Settings"): how origins'
 * circuit breakers trip, cool down and are probed. The edge validates it at start-up and
 * sends the settings with every report.
 */
import { z } from "zod";
import { type BreakerSettings, DEFAULT_BREAKER_SETTINGS } from "../../contracts/breaker.ts";

export const BreakersConfigSchema = z.strictObject({
  /** Breakers on (default) or off: with them off, only the quarantine applies. */
  enabled: z.boolean().optional(),
  consecutive_failures: z.int().min(1).max(1000).optional(),
  failure_ratio: z.number().gt(0).max(1).optional(),
  min_requests: z.int().min(1).optional(),
  window_ms: z.int().min(100).max(600_000).optional(),
  slow_first_byte_ms: z.int().min(1).max(600_000).optional(),
  cooldown_ms: z.int().min(100).max(3_600_000).optional(),
  max_cooldown_ms: z.int().min(100).max(86_400_000).optional(),
  probes: z.int().min(1).max(100).optional(),
  max_ejection_share: z.number().min(0).max(1).optional(),
});
export type BreakersConfig = z.infer<typeof BreakersConfigSchema>;

/** Whether breakers apply under `config` (on unless `enabled: false`). */
export function breakersEnabled(config: BreakersConfig | undefined): boolean {
  return config?.enabled ?? true;
}

/** The settings for `config`, defaults filled in. */
export function breakerSettingsOf(config: BreakersConfig | undefined): BreakerSettings {
  const d = DEFAULT_BREAKER_SETTINGS;
  const cooldownMs = config?.cooldown_ms ?? d.cooldownMs;
  return {
    consecutiveFailures: config?.consecutive_failures ?? d.consecutiveFailures,
    failureRatio: config?.failure_ratio ?? d.failureRatio,
    minRequests: config?.min_requests ?? d.minRequests,
    windowMs: config?.window_ms ?? d.windowMs,
    slowFirstByteMs: config?.slow_first_byte_ms ?? d.slowFirstByteMs,
    cooldownMs,
    maxCooldownMs: Math.max(cooldownMs, config?.max_cooldown_ms ?? d.maxCooldownMs),
    probes: config?.probes ?? d.probes,
    maxEjectionShare: config?.max_ejection_share ?? d.maxEjectionShare,
  };
}
