/**
 * The report of `npm run bench:failover` (docs/benchmarks.md, "Failover"): the seconds of
 * every arm summed per phase, and the targets each arm is scored against.
 */
import { summarize } from "./lib.ts";

export type PhaseName = "healthy" | "errors" | "calm" | "frozen" | "thawed" | "dead" | "back";

/** What the clients saw in one second of one arm. */
export interface Second {
  at: number;
  phase: PhaseName;
  arm: string;
  /** Latencies of the requests sent in this second that ended well (ms). */
  latencies: number[];
  /** Errors that reached their clients in this second. */
  errors: number;
  /** Requests the sick origin served, or tried and failed. */
  toSick: number;
  /** The sick origin's breaker, as last seen in this second. */
  breaker: string | null;
  /** The phase that began during this second, if one did. */
  next?: PhaseName | null;
}

/**
 * The phase in force at `ms` after the start: the last whose fault took effect at or
 * before it (`starts` in order), else the first phase.
 */
export function phaseAt(starts: readonly { name: PhaseName; at: number }[], ms: number): PhaseName {
  let phase: PhaseName = starts[0]?.name ?? "healthy";
  for (const start of starts) if (start.at <= ms) phase = start.name;
  return phase;
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

/** A target as one arm met it or not. */
export interface ArmTarget {
  arm: string;
  target: string;
  measured: string;
  goal: string;
  met: boolean;
}

/** The targets, scored on `armName`'s seconds. */
export function targetsOf(
  seconds: readonly Second[],
  armName: string,
  probes: number,
  cooldownMs: number,
): ArmTarget[] {
  const arm = seconds.filter((s) => s.arm === armName);
  const during = arm.filter((s) => FAULTS.includes(s.phase));
  const errors = during.reduce((n, s) => n + s.errors, 0);
  const requests = during.reduce((n, s) => n + s.errors + s.latencies.length, 0);
  const errorPct = requests === 0 ? Number.NaN : (100 * errors) / requests;
  // Requests to the dead origin once its breaker was seen open; an arm whose breaker never
  // opened there is counted from the dead phase's second second on. The second in which it
  // came back is left out.
  const dead = arm.filter((s) => s.phase === "dead");
  const deadAt = dead[0]?.at;
  const seenOpen = dead.find((s) => s.breaker === "open" || s.breaker === "half_open")?.at;
  const from = seenOpen ?? deadAt;
  const afterOpen =
    from === undefined
      ? Number.NaN
      : dead
          .filter((s) => s.at >= from + 1 && (s.next ?? null) === null)
          .reduce((n, s) => n + s.toSick, 0);
  // p99 of a freeze from 5 s after it began, against the healthy p99.
  const healthy = summarize(
    arm.filter((s) => s.phase === "healthy").flatMap((s) => s.latencies),
  ).p99;
  const frozen = arm.filter((s) => s.phase === "frozen");
  const frozeAt = frozen[0]?.at ?? 0;
  const late = summarize(frozen.filter((s) => s.at >= frozeAt + 5).flatMap((s) => s.latencies)).p99;
  // Full service again: seconds from the origin's return until it takes half of an even
  // share of the requests (of two origins) again, at most: from the start of the second it
  // came back in to the end of the one it took that share in; NaN when not within the phase.
  const back = arm.filter((s) => s.phase === "back");
  const backAt = arm.find((s) => s.next === "back")?.at ?? back[0]?.at;
  const served = back.find(
    (s) => s.toSick > 0 && s.toSick >= HALF_AN_EVEN_SHARE * (s.latencies.length + s.errors),
  );
  const recoveryS =
    backAt === undefined || served === undefined ? Number.NaN : served.at + 1 - backAt;
  const recoveryGoalS = Math.ceil(cooldownMs / 1_000) + 2;
  return [
    {
      arm: armName,
      target: "client-visible errors during the faults",
      measured: `${errorPct.toFixed(2)}% (${errors} of ${requests})`,
      goal: "<= 0.5%",
      met: errorPct <= 0.5,
    },
    {
      arm: armName,
      target:
        "requests sent to the dead origin after its breaker opened (without one opening: from 1 s after it died)",
      measured: String(afterOpen),
      goal: `<= ${probes} (the half-open probes)`,
      met: afterOpen <= probes,
    },
    {
      arm: armName,
      target: "p99 of a freeze from 5 s in, over the healthy p99",
      measured: `${late.toFixed(1)} / ${healthy.toFixed(1)} ms`,
      goal: "<= 2x",
      met: late <= 2 * healthy,
    },
    {
      arm: armName,
      target: "seconds from the origin's return until it takes half an even share again",
      measured: Number.isNaN(recoveryS)
        ? `not within the back phase (${back.length} s)`
        : `${recoveryS} s`,
      goal: `<= ${recoveryGoalS} s (a cooldown, its probes, the edge's copy of the breakers)`,
      met: recoveryS <= recoveryGoalS,
    },
  ];
}

// Two origins: the recovered one's half of an even split.
const HALF_AN_EVEN_SHARE = 0.25;
