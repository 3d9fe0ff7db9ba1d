/**
 * Canary rollouts as every part of warmgate sees them (docs/failover.md, "Canaries"): a
 * share of a model's traffic goes to a canary pool of origins, both arms' error rate and
 * time to first token are compared, and a canary worse than its baseline is rolled back.
 */
import type { CanarySpec } from "./config/canaries.ts";

export type CanaryState = "running" | "paused" | "promoted" | "rolled_back";
export type CanaryArm = "canary" | "baseline";

/** What one reporter saw of one arm since its last report. */
export interface ArmReport {
  requests: number;
  errors: number;
  /** Times to first token of the requests that ended well (ms), at most a few hundred. */
  ttftMs: number[];
}

/** One arm's figures over the recent window. */
export interface ArmFigures {
  requests: number;
  errors: number;
  error_rate: number | null;
  ttft_p50_ms: number | null;
  ttft_p95_ms: number | null;
}

/** A canary as `GET /admin/canaries` shows it. */
export interface CanaryView {
  model: string;
  origins: string[];
  state: CanaryState;
  /** Share of the model's requests that go to the canary now. */
  weight: number;
  since: number;
  /** Why it was rolled back, when it was. */
  reason: string | null;
  arms: Record<CanaryArm, ArmFigures>;
}

/** The name of a canary's object: its model and pool, so a new pool starts afresh. */
export function canaryName(spec: Pick<CanarySpec, "model" | "origins">): string {
  return `${spec.model}|${[...spec.origins].sort().join(",")}`;
}

/** Actions of `POST /admin/canaries/{model}`. */
export type CanaryAction = "promote" | "pause" | "resume" | "rollback";
