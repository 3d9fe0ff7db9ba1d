/**
 * The chaos trial's loss arithmetic (docs/benchmarks.md, "Chaos"): what each request's
 * client saw, its ledger record and what its origins remember of it go in; a bill verdict
 * per request and the loss counts come out. Pure, so records with known faults can be fed
 * to it.
 */
import { type AttemptEnd, outranks } from "../contracts/outcomes.ts";
import { type ModelPrice, type TokenUsage, costPicos } from "../contracts/pricing.ts";
import type { ItemRecord } from "../contracts/protocol/schema.ts";
import type { ChaosOutcome } from "./chaos-client.ts";

/** How a request ended for its client. */
export const REQUEST_OUTCOMES = ["complete", "cancelled", "cut", "refused", "failed"] as const;
/** One of {@link REQUEST_OUTCOMES}. */
export type RequestOutcome = (typeof REQUEST_OUTCOMES)[number];

/** Its bill against what its origins generated; `unchecked` when that cannot be known. */
export type BillVerdict = "exact" | "under" | "over" | "unbilled" | "double" | "unchecked";

/** The 5xx codes the edge documents for origins that failed (docs/errors.md). */
export const DOCUMENTED_5XX = ["origin_error", "no_healthy_origin", "origin_timeout"];

/** A ledger record as `GET /v1/usage/requests/{id}` answers it, its cost in pico-dollars. */
export interface LedgerEntry {
  status: "open" | "settled" | "expired";
  model: string;
  /** The origins its attempts went to (null: none could be tried). */
  origins: (string | null)[];
  outcome: string | null;
  completionTokens: number | null;
  costPicos: bigint;
}

/** An end user's closed ledger rows, as `GET /v1/usage?user=` sums them. */
export interface UserRows {
  requests: number;
  costPicos: bigint;
}

/** Everything the trial learnt of one request. */
export interface RequestFacts {
  seen: ChaosOutcome;
  /** Its record by `x-request-id` soon after the traffic (undefined: no id; null: none). */
  early: LedgerEntry | null | undefined;
  /** Its record once leases have lapsed and reconciliation has run. */
  record: LedgerEntry | null | undefined;
  /** Its end user's closed rows, read when the client saw no id. */
  userRows: UserRows | null;
  /** What its origins remember of its attempts; null when they could not be asked. */
  items: readonly ItemRecord[] | null;
  /** An origin it ran on was killed and lost its memory of it. */
  originForgot: boolean;
  /** It was in flight while the edge was down. */
  crashExposed: boolean;
  /** Refused while a crash's leases could still hold slots. */
  inCrashLeaseWindow: boolean;
  /** The price of the model it was billed for. */
  price: ModelPrice;
}

/** How the request ended for its client. */
export function outcomeOf(seen: ChaosOutcome): RequestOutcome {
  if (seen.complete) return "complete";
  if (seen.status !== null && seen.status >= 400) return seen.status < 500 ? "refused" : "failed";
  if (seen.clientAborted) return "cancelled";
  return seen.status === 200 ? "cut" : "failed";
}

const fromItem = (u: {
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens?: number;
}): TokenUsage => ({
  promptTokens: u.prompt_tokens,
  cachedTokens: u.cached_tokens ?? 0,
  completionTokens: u.completion_tokens,
});

/**
 * What the GPUs generated for a request, by the rule the ledger reconciles by
 * (contracts/outcomes.ts): its finished attempt's usage; else the usage the client was
 * told; else the attempt that rule ranks first. Null when nothing was generated, undefined
 * when it cannot be known (an attempt still runs, or its origin forgot it).
 */
export function generatedBy(facts: RequestFacts): TokenUsage | null | undefined {
  const items = facts.items ?? [];
  if (items.some((i) => i.state === "running")) return undefined;
  const ended = items.flatMap((i) => (i.state === "ended" ? [i] : []));
  const finished = ended.find((i) => i.outcome === "ok" && i.usage !== null);
  if (finished?.usage) return fromItem(finished.usage);
  if (facts.seen.usage !== null && facts.seen.complete) return fromItem(facts.seen.usage);
  if (facts.items === null || facts.originForgot) return undefined;
  let best: AttemptEnd | null = null;
  for (const item of ended) {
    if (item.usage !== null && (best === null || outranks(item, best))) best = item;
  }
  return best?.usage ? fromItem(best.usage) : null;
}

/** The request's bill against what was generated. */
export function billVerdict(facts: RequestFacts): BillVerdict {
  if (facts.record === undefined) {
    // No id: its end user's rows say whether it was recorded twice, nothing more.
    return (facts.userRows?.requests ?? 0) > 1 ? "double" : "unchecked";
  }
  const usage = generatedBy(facts);
  if (usage === undefined) return "unchecked";
  const expected = usage === null ? 0n : costPicos(usage, facts.price);
  const billed = facts.record?.costPicos ?? 0n;
  if (billed === expected) return "exact";
  if (billed === 0n) return "unbilled";
  if (billed < expected) return "under";
  return expected > 0n && billed >= 2n * expected ? "double" : "over";
}

/** One row of the bills table: the requests that ended one way. */
export interface OutcomeRow {
  outcome: RequestOutcome;
  sent: number;
  /** Matched to their record by `x-request-id`; the rest only by their end user's rows. */
  byId: number;
  /** Completion tokens their origins generated (where known). */
  generatedTokens: number;
  exact: number;
  under: number;
  over: number;
  unbilled: number;
  double: number;
  unchecked: number;
  /** Completion tokens generated for requests billed nothing. */
  unbilledTokens: number;
}

/** Counts every request's verdict by how it ended. */
export function billsByOutcome(facts: readonly RequestFacts[]): OutcomeRow[] {
  const rows = new Map<RequestOutcome, OutcomeRow>();
  for (const outcome of REQUEST_OUTCOMES) {
    rows.set(outcome, {
      outcome,
      sent: 0,
      byId: 0,
      generatedTokens: 0,
      exact: 0,
      under: 0,
      over: 0,
      unbilled: 0,
      double: 0,
      unchecked: 0,
      unbilledTokens: 0,
    });
  }
  for (const f of facts) {
    const row = rows.get(outcomeOf(f.seen));
    if (row === undefined) continue;
    const verdict = billVerdict(f);
    const tokens = generatedBy(f)?.completionTokens ?? 0;
    row.sent++;
    if (f.record !== undefined) row.byId++;
    row.generatedTokens += tokens;
    row[verdict]++;
    if (verdict === "unbilled") row.unbilledTokens += tokens;
  }
  return [...rows.values()];
}

/** A key's rollup totals (`GET /v1/usage`) and what its closed rows add up to. */
export interface RollupCheck {
  rollup: UserRows;
  rows: UserRows;
}

/** The trial's losses: each one's target is 0. */
export interface ChaosLosses {
  unbilled: number;
  billed_under: number;
  billed_over: number;
  billed_double: number;
  reservations_open_before_leases: number;
  reservations_open_after_leases: number;
  expired_without_a_crash: number;
  slots_refused_before_leases: number;
  slots_refused_after_leases: number;
  refused_for_concurrency_below_limit: number;
  cancels_run_to_the_end: number;
  usage_told_differs: number;
  silently_truncated_200s: number;
  cut_recorded_ok: number;
  "5xx_undocumented": number;
  non_openai_error_bodies: number;
  rollup_requests_over_rows: number;
  rollup_requests_under_rows: number;
  rollup_cost_off_rows_usd: number;
}

/** What the trial measured apart from the requests: the slot probes and the rollups. */
export interface KeyChecks {
  slotsRefusedBeforeLeases: number;
  slotsRefusedAfterLeases: number;
  rollups: readonly RollupCheck[];
}

/** The examples kept of each loss: which requests. */
export type LossExamples = Partial<Record<keyof ChaosLosses, RequestFacts[]>>;

const usageDiffers = (f: RequestFacts): boolean => {
  const told = f.seen.usage;
  const ok = f.items?.find((i) => i.state === "ended" && i.outcome === "ok");
  if (!f.seen.complete || told === null || ok?.state !== "ended" || ok.usage === null) {
    return false;
  }
  return (
    ok.usage.prompt_tokens !== told.prompt_tokens ||
    ok.usage.completion_tokens !== told.completion_tokens
  );
};

// Each per-request loss: whether this request shows it.
const REQUEST_LOSSES: [keyof ChaosLosses, (f: RequestFacts) => boolean][] = [
  ["unbilled", (f) => billVerdict(f) === "unbilled"],
  ["billed_under", (f) => billVerdict(f) === "under"],
  ["billed_over", (f) => billVerdict(f) === "over"],
  ["billed_double", (f) => billVerdict(f) === "double"],
  ["reservations_open_before_leases", (f) => f.early?.status === "open"],
  ["reservations_open_after_leases", (f) => f.record?.status === "open"],
  [
    "expired_without_a_crash",
    (f) => !f.crashExposed && (f.early?.status === "expired" || f.record?.status === "expired"),
  ],
  [
    "refused_for_concurrency_below_limit",
    (f) => f.seen.concurrencyRefusal && !f.inCrashLeaseWindow,
  ],
  [
    // A cancel after three reads of a long stream: an origin that ran it to its end never
    // heard of the cancel.
    "cancels_run_to_the_end",
    (f) =>
      f.seen.kind === "cancel" &&
      outcomeOf(f.seen) === "cancelled" &&
      (f.items ?? []).some((i) => i.state === "ended" && i.outcome === "ok"),
  ],
  ["usage_told_differs", usageDiffers],
  ["silently_truncated_200s", (f) => f.seen.silentlyTruncated],
  [
    // A client's own abort after the edge wrote the whole answer is delivered, as far as
    // any server can tell; anything else cut and recorded `ok` is a loss.
    "cut_recorded_ok",
    (f) => outcomeOf(f.seen) === "cut" && f.record?.outcome === "ok",
  ],
  [
    "5xx_undocumented",
    (f) =>
      f.seen.status !== null &&
      f.seen.status >= 500 &&
      (f.seen.code === null || !DOCUMENTED_5XX.includes(f.seen.code)),
  ],
  ["non_openai_error_bodies", (f) => f.seen.badErrorBody],
];

// Losses of the key as a whole, from the probes and the rollups.
const KEY_LOSSES: (keyof ChaosLosses)[] = [
  "slots_refused_before_leases",
  "slots_refused_after_leases",
  "rollup_requests_over_rows",
  "rollup_requests_under_rows",
  "rollup_cost_off_rows_usd",
];

/** Every loss of a trial, with up to `keep` example requests of each. */
export function chaosLosses(
  facts: readonly RequestFacts[],
  checks: KeyChecks,
  keep = 5,
): { losses: ChaosLosses; examples: LossExamples } {
  const losses = Object.fromEntries(
    [...REQUEST_LOSSES.map(([name]) => name), ...KEY_LOSSES].map((name) => [name, 0]),
  ) as unknown as ChaosLosses;
  const examples: LossExamples = {};
  for (const f of facts) {
    for (const [name, shows] of REQUEST_LOSSES) {
      if (!shows(f)) continue;
      losses[name]++;
      const list = (examples[name] ??= []);
      if (list.length < keep) list.push(f);
    }
  }
  losses.slots_refused_before_leases = checks.slotsRefusedBeforeLeases;
  losses.slots_refused_after_leases = checks.slotsRefusedAfterLeases;
  let off = 0n;
  for (const { rollup, rows } of checks.rollups) {
    losses.rollup_requests_over_rows += Math.max(0, rollup.requests - rows.requests);
    losses.rollup_requests_under_rows += Math.max(0, rows.requests - rollup.requests);
    off +=
      rollup.costPicos > rows.costPicos
        ? rollup.costPicos - rows.costPicos
        : rows.costPicos - rollup.costPicos;
  }
  losses.rollup_cost_off_rows_usd = Number(off) / 1e12;
  return { losses, examples };
}

/** 5xx answers and stream error events, counted by their error code. */
export function errorsByCode(seen: readonly ChaosOutcome[]): {
  answers: Record<string, number>;
  events: Record<string, number>;
} {
  const answers: Record<string, number> = {};
  const events: Record<string, number> = {};
  for (const code of DOCUMENTED_5XX) {
    answers[code] = 0;
    events[code] = 0;
  }
  for (const s of seen) {
    if (s.status !== null && s.status >= 500) {
      const code = s.code ?? "none";
      answers[code] = (answers[code] ?? 0) + 1;
    }
    if (s.errorEvent) {
      const code = s.eventCode ?? "none";
      events[code] = (events[code] ?? 0) + 1;
    }
  }
  return { answers, events };
}

/** 5xx answers by code in each second from the first request sent, by when the client saw them. */
export function errorsPerSecond(seen: readonly ChaosOutcome[]): Record<string, number[]> {
  const start = Math.min(...seen.map((s) => s.sentAt));
  const perSecond: Record<string, number[]> = {};
  for (const s of seen) {
    if (s.status === null || s.status < 500) continue;
    const row = (perSecond[s.code ?? "none"] ??= []);
    const second = Math.floor((s.endedAt - start) / 1000);
    for (let i = row.length; i <= second; i++) row.push(0);
    row[second] = (row[second] ?? 0) + 1;
  }
  return perSecond;
}
