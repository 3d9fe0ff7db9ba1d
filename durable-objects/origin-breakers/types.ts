/**
 * The contract of `OriginBreakers` (docs/failover.md, "Breakers"): one object per region,
 * named by the region's id, holding the breaker of each of its origins.
 */
export type { BreakerView, OutcomeReport } from "../../contracts/breaker.ts";

/** How long a health probe of a half-open origin may take. */
export const PROBE_TIMEOUT_MS = 2_000;

/** Gap between the probes of a half-open origin. */
export const PROBE_INTERVAL_MS = 500;
