/**
 * The `alerts` section of `WARMGATE_CONFIG`: where soft-budget alerts go when a key names
 * no webhook of its own, and how their delivery is retried, resolved with every default
 * (docs/configuration.md, "Alerts"; docs/key-account.md, "Soft budgets and alerts").
 */
import { z } from "zod";

/** Alert settings as written, resolved to what the key accounts run with. */
export const AlertsSchema = z
  .strictObject({
    /** Where a key's soft-budget alerts go unless the key names its own; null: nowhere. */
    webhook_url: z
      .url({ protocol: /^https?$/ })
      .max(2_048)
      .nullable()
      .default(null),
    /** Deliveries tried per alert before it is dropped. */
    max_attempts: z.int().min(1).max(20).default(8),
    /** Wait before the first retry; each next one waits twice as long (at most an hour). */
    retry_base_ms: z.int().min(10).max(600_000).default(5_000),
  })
  .transform((alerts) => ({
    webhookUrl: alerts.webhook_url,
    maxAttempts: alerts.max_attempts,
    retryBaseMs: alerts.retry_base_ms,
  }));

/** Alert settings, every default applied. */
export type AlertSettings = z.output<typeof AlertsSchema>;
