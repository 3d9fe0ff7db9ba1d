/**
 * The `leases` section of `WARMGATE_CONFIG`: whether edge isolates admit keys' and end users'
 * requests under leased allowances, and for how long a lease admits without renewal, resolved with
 * every default (docs/configuration.md, "Leases"; docs/key-account.md, "Leased allowances").
 */
import { z } from "zod";

/** Lease settings as written, resolved to what the edge runs with. */
export const LeasesSchema = z
  .strictObject({
    /** Admit requests that fit a key's lease in the isolate, with no account call. */
    enabled: z.boolean().default(true),
    /**
     * How long a lease admits without a renewal: the longest a revocation, a rotation or a
     * change of the key takes to reach every isolate.
     */
    window_ms: z.int().min(500).max(30_000).default(2_000),
  })
  .transform((leases) => ({ enabled: leases.enabled, windowMs: leases.window_ms }));

/** Lease settings, every default applied. */
export type LeaseSettings = z.output<typeof LeasesSchema>;
