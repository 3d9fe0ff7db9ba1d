/**
 * An origin's circuit breaker as every part of warmgate sees it (docs/failover.md): its
 * state, the outcomes reported to it, and the settings it trips by. The state machine is a
 * pure core in `durable-objects/origin-breakers/breaker.ts`; the edge and the Batchers keep
 * a cached copy of these views.
 */
import type { BreakerSettings } from "./config/breakers.ts";

export type BreakerState = "closed" | "open" | "half_open";

/** One origin's breaker, as `GET /admin/breakers` lists it. */
export interface BreakerView {
  region: string;
  origin: string;
  state: BreakerState;
  /** When it entered its state, epoch ms. */
  since: number;
  /** Failures and requests in the sliding window. */
  failures: number;
  requests: number;
  /** Times live traffic opened it since it was last forced closed (not a failed probe). */
  opened_count: number;
  /** When an open breaker lets its first probe through, epoch ms; null unless open. */
  retry_at: number | null;
  /** Set by an operator (`POST /admin/breakers/{origin}`): it stays so until set again. */
  forced: boolean;
}

/** What one reporter saw of one origin since its last report. */
export interface OutcomeReport {
  origin: string;
  /** Requests that ended, or failed, at the origin: successes plus failures. */
  requests: number;
  /** Connection errors, 5xx, broken answers, silences and late HEADs of an idle origin. */
  failures: number;
  /** Failures since the reporter's last success (all of `failures` when none succeeded). */
  trailing: number;
}

/**
 * One observation of an origin, as its reporter judged it (docs/failover.md, "What counts"):
 * it answered whole; it failed (unreachable, a 5xx that another origin did not give, an
 * answer cut after its HEAD); or it was silent past the limit on a thread that kept time,
 * or late with a HEAD while its reports said it was idle (`slow`). Both count as failures.
 */
export type Verdict = "ok" | "failed" | "slow";

/**
 * A region as a reporter knows it: its origins and the settings its breakers trip by. The
 * edge also names each origin's credentials (secret names) and a model it serves, for the
 * probes; a reporter that leaves them out keeps what the object last heard.
 */
export interface BreakerRegion {
  id: string;
  origins: { id: string; url: string; credentials?: readonly string[]; probeModel?: string }[];
  settings: BreakerSettings;
}
