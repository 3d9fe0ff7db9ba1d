/**
 * A canary rollout as a pure state machine (docs/failover.md, "Canaries"): each arm keeps
 * its latest outcomes; once both arms have `minRequests`, a canary whose error rate exceeds
 * the baseline's by more than allowed, or whose TTFT p95 is too many times the baseline's,
 * is rolled back. An operator may promote, pause, resume or roll it back. Pure.
 */
import type {
  ArmFigures,
  ArmReport,
  CanaryAction,
  CanaryArm,
  CanaryState,
  CanaryView,
} from "../../contracts/canary.ts";
import type { CanarySpec } from "../../contracts/config/canaries.ts";

/** Outcomes each arm remembers (the newest). */
export const ARM_MEMORY = 2_000;

interface ArmState {
  /** 1 per error, 0 per success, newest last. */
  outcomes: number[];
  ttftMs: number[];
}

export interface Canary {
  model: string;
  state: CanaryState;
  since: number;
  reason: string | null;
  arms: Record<CanaryArm, ArmState>;
}

export function newCanary(model: string, now: number): Canary {
  return {
    model,
    state: "running",
    since: now,
    reason: null,
    arms: { canary: emptyArm(), baseline: emptyArm() },
  };
}

/**
 * Takes in a reporter's outcomes of both arms; a running canary may be rolled back.
 * Outcomes recorded while the reporter knew an earlier state (`since`, its `since`; null
 * when it knew none) belong to that state's comparison and are left out.
 */
export function record(
  c: Canary,
  reports: Partial<Record<CanaryArm, ArmReport>>,
  spec: CanarySpec,
  now: number,
  since: number | null = null,
): Canary {
  if (since !== null && since < c.since) return c;
  const arms = { canary: c.arms.canary, baseline: c.arms.baseline };
  for (const arm of ["canary", "baseline"] as const) {
    const report = reports[arm];
    if (report !== undefined) arms[arm] = add(arms[arm], report);
  }
  const next = { ...c, arms };
  if (c.state !== "running") return next;
  const verdict = judge(next, spec);
  return verdict === null ? next : { ...next, state: "rolled_back", since: now, reason: verdict };
}

/** An operator's action. */
export function act(c: Canary, action: CanaryAction, now: number): Canary {
  const state: CanaryState =
    action === "promote"
      ? "promoted"
      : action === "pause"
        ? "paused"
        : action === "resume"
          ? "running"
          : "rolled_back";
  const reason = action === "rollback" ? "rolled back by an operator" : null;
  // Resuming starts the comparison afresh.
  const arms = action === "resume" ? { canary: emptyArm(), baseline: emptyArm() } : c.arms;
  return { ...c, state, since: now, reason, arms };
}

/** The share of the model's requests the canary takes in its state. */
export function weightOf(state: CanaryState, spec: CanarySpec): number {
  return state === "running" ? spec.weight : state === "promoted" ? 1 : 0;
}

export function viewOf(c: Canary, spec: CanarySpec): CanaryView {
  return {
    model: c.model,
    origins: [...spec.origins],
    state: c.state,
    weight: weightOf(c.state, spec),
    since: c.since,
    reason: c.reason,
    arms: { canary: figures(c.arms.canary), baseline: figures(c.arms.baseline) },
  };
}

// Why the canary is worse than its baseline, or null while it is not (or too soon to say).
function judge(c: Canary, spec: CanarySpec): string | null {
  const canary = figures(c.arms.canary);
  const baseline = figures(c.arms.baseline);
  if (canary.requests < spec.minRequests || baseline.requests < spec.minRequests) return null;
  const errors = (canary.error_rate ?? 0) - (baseline.error_rate ?? 0);
  if (errors > spec.maxErrorRateIncrease) {
    return `error rate ${pct(canary.error_rate)} against ${pct(baseline.error_rate)}`;
  }
  const enough = (arm: CanaryArm) => c.arms[arm].ttftMs.length >= spec.minRequests;
  if (
    enough("canary") &&
    enough("baseline") &&
    canary.ttft_p95_ms !== null &&
    baseline.ttft_p95_ms !== null &&
    canary.ttft_p95_ms > spec.maxTtftP95Ratio * Math.max(1, baseline.ttft_p95_ms)
  ) {
    return `TTFT p95 ${Math.round(canary.ttft_p95_ms)} ms against ${Math.round(baseline.ttft_p95_ms)} ms`;
  }
  return null;
}

function figures(arm: ArmState): ArmFigures {
  const requests = arm.outcomes.length;
  const errors = arm.outcomes.reduce((n, o) => n + o, 0);
  const sorted = [...arm.ttftMs].sort((a, b) => a - b);
  const at = (q: number) =>
    sorted.length === 0
      ? null
      : (sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? null);
  return {
    requests,
    errors,
    error_rate: requests === 0 ? null : errors / requests,
    ttft_p50_ms: at(0.5),
    ttft_p95_ms: at(0.95),
  };
}

function add(arm: ArmState, report: ArmReport): ArmState {
  const outcomes = [...arm.outcomes];
  const ok = Math.max(0, report.requests - report.errors);
  for (let i = 0; i < ok; i++) outcomes.push(0);
  for (let i = 0; i < report.errors; i++) outcomes.push(1);
  const ttftMs = [...arm.ttftMs, ...report.ttftMs.filter((t) => Number.isFinite(t) && t >= 0)];
  return { outcomes: outcomes.slice(-ARM_MEMORY), ttftMs: ttftMs.slice(-ARM_MEMORY) };
}

function emptyArm(): ArmState {
  return { outcomes: [], ttftMs: [] };
}

function pct(rate: number | null): string {
  return `${((rate ?? 0) * 100).toFixed(1)}%`;
}
