/**
 * The report of `npm run bench:failover` (docs/benchmarks.md, "Failover"): the seconds of
 * both arms summed per phase, and the targets the breakers must meet.
 */
import { summarize } from "./lib.ts";

export type PhaseName = "healthy" | "errors" | "calm" | "frozen" | "thawed" | "dead" | "back";

/** What the clients saw in one second of one arm. */
export interface Second {
  at: number;
  phase: PhaseName;
  arm: string;
  /** Latencies of the requests that ended well in this second (ms). */
  latencies: number[];
  errors: number;
  /** Requests the sick origin served, or tried and failed. */
  toSick: number;
  /** The sick origin's breaker, as last seen in this second. */
  breaker: string | null;
}

export interface PhaseRow {
  arm: string;
  phase: PhaseName;
  requests: number;
  errors: number;
  errorPct: number;
  p50: number;
  p99: number;
  toSick: number;
}

export function phaseRows(
  seconds: readonly Second[],
  arms: readonly string[],
  phases: readonly { name: PhaseName }[],
): PhaseRow[] {
  const rows: PhaseRow[] = [];
  for (const arm of arms) {
    for (const { name } of phases) {
      const mine = seconds.filter((s) => s.arm === arm && s.phase === name);
      const latencies = mine.flatMap((s) => s.latencies);
      const errors = mine.reduce((n, s) => n + s.errors, 0);
      const requests = latencies.length + errors;
      const summary = summarize(latencies);
      rows.push({
        arm,
        phase: name,
        requests,
        errors,
        errorPct: requests === 0 ? Number.NaN : (100 * errors) / requests,
        p50: summary.p50,
        p99: summary.p99,
        toSick: mine.reduce((n, s) => n + s.toSick, 0),
      });
    }
  }
  return rows;
}

const FAULTS: readonly PhaseName[] = ["errors", "frozen", "dead"];

/** The targets, measured on the `breakers` arm. */
export function targetsOf(seconds: readonly Second[], probes: number) {
  const arm = seconds.filter((s) => s.arm === "breakers");
  const during = arm.filter((s) => FAULTS.includes(s.phase));
  const errors = during.reduce((n, s) => n + s.errors, 0);
  const requests = during.reduce((n, s) => n + s.errors + s.latencies.length, 0);
  const errorPct = requests === 0 ? Number.NaN : (100 * errors) / requests;
  // Requests to the dead origin once its breaker was seen open.
  const dead = arm.filter((s) => s.phase === "dead");
  const openedAt = dead.find((s) => s.breaker === "open" || s.breaker === "half_open")?.at;
  const afterOpen =
    openedAt === undefined
      ? Number.NaN
      : dead.filter((s) => s.at > openedAt).reduce((n, s) => n + s.toSick, 0);
  // p99 of a freeze from 5 s after it began, against the healthy p99.
  const healthy = summarize(
    arm.filter((s) => s.phase === "healthy").flatMap((s) => s.latencies),
  ).p99;
  const frozen = arm.filter((s) => s.phase === "frozen");
  const frozeAt = frozen[0]?.at ?? 0;
  const late = summarize(frozen.filter((s) => s.at >= frozeAt + 5).flatMap((s) => s.latencies)).p99;
  return [
    {
      target: "client-visible errors during the faults",
      measured: `${errorPct.toFixed(2)}% (${errors} of ${requests})`,
      goal: "<= 0.5%",
      met: errorPct <= 0.5,
    },
    {
      target: "requests sent to the dead origin after its breaker opened",
      measured: String(afterOpen),
      goal: `<= ${probes} (the half-open probes)`,
      met: afterOpen <= probes,
    },
    {
      target: "p99 of a freeze from 5 s in, over the healthy p99",
      measured: `${late.toFixed(1)} / ${healthy.toFixed(1)} ms`,
      goal: "<= 2x",
      met: late <= 2 * healthy,
    },
  ];
}
