/**
 * The report of `npm run bench:burst` (docs/benchmarks.md, "Burst"): the targets each
 * phase is scored against, and the tables printed.
 */
import { type Outcome, tally } from "./burst-client.ts";
import type { BurstRun, PoisonRun, RestartRun } from "./burst-phases.ts";
import type { CappedPhase } from "./burst-capped.ts";
import { fmt, markdownTable } from "./lib.ts";

/** One target: what was measured against its goal. */
export interface BurstTarget {
  target: string;
  value: number;
  measured: string;
  goal: string;
  met: boolean;
}

const zero = (target: string, value: number, measured = String(value)): BurstTarget => ({
  target,
  value,
  measured,
  goal: "0",
  met: value === 0,
});

/** TTFT of the first single request after a burst, over the pre-burst p50 (NaN if not whole). */
export function firstAfterRatio(run: BurstRun, baselineP50: number): number {
  const first = run.after[0];
  return first?.kind === "whole" && first.ttftMs !== null ? first.ttftMs / baselineP50 : Number.NaN;
}

/** Every target of a run, each with `met`. */
export function burstTargets(
  runs: readonly BurstRun[],
  baselineP50: number,
  poisoned: PoisonRun | null,
  restarted: RestartRun | null,
  probeBudgetMs: (cooldownMs: number) => number,
  capped: CappedPhase | null = null,
): BurstTarget[] {
  const targets: BurstTarget[] = [];
  const healthy = runs.filter((r) => r.phase === "healthy");
  if (healthy.length > 0) {
    const all = tally(healthy.flatMap((r) => [...r.burst, ...r.after]));
    targets.push(zero("healthy bursts: no_healthy_origin answers", all.noHealthyOrigin));
    const openings = healthy.reduce((n, r) => n + r.breakers.openings.total, 0);
    targets.push(zero("healthy bursts: breaker openings", openings));
    targets.push(zero("healthy bursts: streams cut after their first byte", all.cut));
    const neither = all.sent - all.whole - all.refusedWithRetryAfter;
    targets.push(
      zero(
        "healthy bursts: requests neither served whole nor refused at once with retry-after",
        neither,
        `${neither} of ${all.sent}`,
      ),
    );
    for (const run of healthy) {
      const ratio = firstAfterRatio(run, baselineP50);
      const first = run.after[0];
      targets.push({
        target: `healthy burst of ${run.size}: TTFT of the first single request after it / pre-burst p50`,
        value: ratio,
        measured: `${fmt(first?.ttftMs ?? Number.NaN, 1)} / ${fmt(baselineP50, 1)} ms = ${fmt(ratio)}×${first !== undefined && first.kind !== "whole" ? ` (${first.kind})` : ""}`,
        goal: "<= 2×",
        met: ratio <= 2,
      });
    }
  }
  const frozen = runs.filter((r) => r.phase === "frozen");
  if (frozen.length > 0) {
    const origin = frozen[0]?.frozen?.origin ?? "?";
    const itOpened = frozen.filter((r) => r.breakers.openings.opened.includes(origin)).length;
    const others = [...new Set(frozen.flatMap((r) => r.breakers.openings.opened))].filter(
      (o) => o !== origin,
    );
    targets.push({
      target: "frozen origin: only its breaker opens",
      value: others.length,
      measured: `${origin} opened in ${itOpened} of ${frozen.length} bursts; others: ${others.join(", ") || "none"}`,
      goal: `${origin} in every burst, no other`,
      met: itOpened === frozen.length && others.length === 0,
    });
    const accepted = frozen.flatMap((r) => r.burst).filter((o) => o.status === 200);
    const whole = accepted.filter((o) => o.kind === "whole").length;
    targets.push({
      target: "frozen origin: accepted requests (200) of the bursts served whole",
      value: accepted.length - whole,
      measured: `${whole} of ${accepted.length}`,
      goal: "all",
      met: whole === accepted.length,
    });
  }
  if (poisoned !== null) {
    targets.push(zero("poison: breaker openings", poisoned.breakers.openings.total));
    const served = poisoned.ordinary.filter((o) => o.kind === "whole").length;
    targets.push({
      target: "poison: ordinary requests served whole",
      value: poisoned.ordinary.length - served,
      measured: `${served} of ${poisoned.ordinary.length}`,
      goal: "all",
      met: poisoned.ordinary.length > 0 && served === poisoned.ordinary.length,
    });
  }
  if (capped !== null && capped.runs.length > 0) targets.push(...cappedTargets(capped));
  if (restarted !== null) {
    const budget = restarted.cooldownMs === null ? Number.NaN : probeBudgetMs(restarted.cooldownMs);
    const ms = restarted.fullServiceMs ?? Number.NaN;
    targets.push({
      target: `restart mid-cooldown: ${restarted.origin}'s opening to a request it served whole`,
      value: ms,
      measured:
        (restarted.fullServiceMs === null ? "never, within the wait" : `${fmt(ms, 0)} ms`) +
        (restarted.note === null ? "" : ` (${restarted.note})`),
      goal: `<= cooldown + 2 probe intervals = ${fmt(budget, 0)} ms`,
      met: restarted.note === null && ms <= budget,
    });
  }
  return targets;
}

/** The connection-cap phase: bursts past the origins' cap are overload, not an outage. */
function cappedTargets(capped: CappedPhase): BurstTarget[] {
  const { busy, closed } = capped.refused;
  const all = tally(capped.runs.flatMap((r) => [...r.burst, ...r.after]));
  const neither = all.sent - all.whole - all.refusedWithRetryAfter;
  const openings = capped.runs.reduce((n, r) => n + r.breakers.openings.total, 0);
  const label = `origins capped at ${capped.maxConnections}`;
  const capacity = capped.origins * capped.maxConnections;
  return [
    {
      target: `${label}: connections the origins answered busy (the bursts reached the cap)`,
      value: busy,
      measured: String(busy),
      goal: "> 0",
      met: busy > 0,
    },
    zero(`${label}: connections closed unanswered (bursts within four times the cap)`, closed),
    zero(`${label}: breaker openings`, openings),
    ...capped.runs.map((run) => {
      const whole = tally(run.burst).whole;
      const floor = 0.9 * Math.min(run.size, capacity);
      return {
        target: `${label}, burst of ${run.size}: served whole (the origins serve ${capacity} at once)`,
        value: whole,
        measured: `${whole} of ${run.size}`,
        goal: `>= ${fmt(floor, 0)} (0.9 × ${Math.min(run.size, capacity)})`,
        met: whole >= floor,
      };
    }),
    zero(`${label}: streams cut after their first byte`, all.cut),
    zero(
      `${label}: requests neither served whole nor refused at once with retry-after`,
      neither,
      `${neither} of ${all.sent}`,
    ),
    ...capped.runs.map((run) => {
      const ratio = firstAfterRatio(run, capped.baselineP50);
      const first = run.after[0];
      return {
        target: `${label}, burst of ${run.size}: TTFT of the first single request after it / pre-burst p50`,
        value: ratio,
        measured: `${fmt(first?.ttftMs ?? Number.NaN, 1)} / ${fmt(capped.baselineP50, 1)} ms = ${fmt(ratio)}×${first !== undefined && first.kind !== "whole" ? ` (${first.kind})` : ""}`,
        goal: "<= 2×",
        met: ratio <= 2,
      };
    }),
  ];
}

function outcomeCells(outcomes: readonly Outcome[]): string[] {
  const t = tally(outcomes);
  return [
    String(t.sent),
    String(t.whole),
    `${t.refused} (${t.refusedWithRetryAfter})`,
    `${t.cut} (${t.cutAfterTokens})`,
    String(t.failed),
    String(t.noHealthyOrigin),
  ];
}

const OUTCOME_COLUMNS = [
  "sent",
  "whole",
  "refused (with retry-after)",
  "cut (after tokens)",
  "no answer",
  "no_healthy_origin",
];

/** The table of bursts: outcomes, breakers, and the single requests after each. */
export function burstTable(runs: readonly BurstRun[], baselineP50: number): string {
  return markdownTable(
    [
      "phase",
      "burst",
      ...OUTCOME_COLUMNS,
      "breakers opened",
      "burst s",
      "TTFT p50 / p99",
      "first single TTFT",
      "/ pre-burst p50",
      "singles (whole) TTFT p50",
    ],
    runs.map((r) => {
      const burst = tally(r.burst);
      const after = tally(r.after);
      const opened = r.breakers.openings.opened;
      return [
        r.phase === "frozen"
          ? `${r.frozen?.origin} frozen ${fmt((r.frozen?.ms ?? 0) / 1000, 1)} s`
          : r.phase,
        String(r.size),
        ...outcomeCells(r.burst),
        opened.length === 0 ? "none" : opened.join(", "),
        fmt(r.burstSeconds, 1),
        `${fmt(burst.ttftP50, 0)} / ${fmt(burst.ttftP99, 0)}`,
        fmt(r.after[0]?.ttftMs ?? Number.NaN, 1),
        `${fmt(firstAfterRatio(r, baselineP50))}×`,
        `${fmt(after.ttftP50, 1)} (${after.whole}/${after.sent})`,
      ];
    }),
  );
}

/** The table of the poison phase. */
export function poisonTable(run: PoisonRun): string {
  return markdownTable(
    ["requests", ...OUTCOME_COLUMNS, "breakers opened"],
    [
      ["poison", ...outcomeCells(run.poison), ""],
      [
        "ordinary",
        ...outcomeCells(run.ordinary),
        run.breakers.openings.opened.join(", ") || "none",
      ],
    ],
  );
}

/** The table of targets. */
export function targetTable(targets: readonly BurstTarget[]): string {
  return markdownTable(
    ["target", "measured", "goal", "met"],
    targets.map((t) => [t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  );
}

/** What went wrong, by kind, over every outcome given. */
export function errorLines(label: string, outcomes: readonly Outcome[]): string[] {
  return Object.entries(tally(outcomes).errors).map(([kind, n]) => `- ${label}: ${n} × ${kind}`);
}
