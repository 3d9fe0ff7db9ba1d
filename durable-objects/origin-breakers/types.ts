/**
 * The contract of `OriginBreakers` (docs/failover.md, "Breakers"): one object per region,
 * named by the region's id, holding the breaker of each of its origins.
 */
export type { BreakerView, OutcomeReport } from "../../contracts/breaker.ts";

/** How long a health probe of a half-open origin may take (of the object's on-time). */
export const PROBE_TIMEOUT_MS = 2_000;

/** Gap between the probes of a half-open origin. */
export const PROBE_INTERVAL_MS = 500;

/**
 * Least gap between two reach checks of one origin: a failing origin that can be reached
 * costs its region's object one `/health` call a second at most.
 */
export const REACH_CHECK_GAP_MS = 1_000;

/** An origin as its probe reaches it. */
export interface ProbeTarget {
  id: string;
  url: string;
  /** Names of the secrets holding its credentials. */
  credentials?: readonly string[];
  /** A model it serves: the probe completes one token of it (else `/health` alone). */
  probeModel?: string;
}
