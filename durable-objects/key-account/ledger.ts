/**
 * The ledger's arithmetic (docs/key-account.md, "Keys and settlement"): what settling or
 * expiring a request changes, as a value. Pure: the store applies the change (buckets,
 * the row, spend and usage: `AccountStore.apply`).
 */
import { billedPicos, type TokenUsage, utcDay } from "../../contracts/pricing.ts";
import { hourOf } from "../../contracts/budget-periods.ts";
import { tokenCorrection } from "./admission.ts";
import type { PeriodSpend } from "./budgets.ts";
import { type LedgerEntry, NOT_CLOSED, priceOf, rowTags, storedCandidate } from "./schema.ts";
import type { SettleInput, SettleResult } from "./types.ts";
import type { SettleMetrics } from "./settle-types.ts";

/** A change to one model's usage of the row's day. */
export interface UsageDelta {
  model: string;
  requests: number;
  tokens: TokenUsage | null;
  costPicos: bigint;
}

/** What one ledger event changes. */
export interface LedgerChange {
  /** The row as it is after the event. */
  row: LedgerEntry;
  /** Tokens charged (positive) or given back (negative) to the key's and the subject's buckets. */
  tokens: number;
  /** Added to the spend of the row's hour (the key's, its end user's) and the lifetime. */
  spend: PeriodSpend;
  /** Added to the usage of the row's day. */
  usage: UsageDelta[];
}

/**
 * Settles an open, expired or forgotten row with the request's real usage, billed at most
 * `capPicos` (null: no cap).
 */
export function settleRow(
  row: LedgerEntry,
  input: SettleInput,
  now: number,
  capPicos: bigint | null,
): { change: LedgerChange; result: SettleResult } {
  const usage = input.usage ?? null;
  const usedTokens = usage === null ? null : usage.prompt_tokens + usage.completion_tokens;
  // The model that served it, if it was one of the request's candidates.
  const served =
    row.candidates.find(([model]) => model === input.model) ??
    row.candidates.find(([model]) => model === row.model);
  const model = served?.[0] ?? row.model;
  const tokens: TokenUsage | null =
    usage === null
      ? null
      : {
          promptTokens: usage.prompt_tokens,
          cachedTokens: usage.cached_tokens ?? 0,
          completionTokens: usage.completion_tokens,
        };
  // An expired row released its reservation and was counted when it expired.
  const late = row.state === "expired";
  // A hit generated nothing: billed at its share of the price, every reserved token back.
  const hit = input.cache?.result === "hit";
  const cost = billedPicos(
    tokens,
    priceOf(served),
    capPicos,
    hit ? input.cache?.pricePpm : undefined,
  );
  const counted: UsageDelta[] =
    late && model !== row.model
      ? [{ model: row.model, requests: -1, tokens: null, costPicos: 0n }]
      : [];
  const change: LedgerChange = {
    row: {
      ...row,
      state: "settled",
      closedAt: now,
      outcome: input.outcome,
      model,
      promptTokens: usage?.prompt_tokens ?? null,
      cachedTokens: usage === null ? null : (usage.cached_tokens ?? 0),
      completionTokens: usage?.completion_tokens ?? null,
      costPicos: cost,
      ...deliveredAs(row, input),
      cacheHit: hit,
    },
    tokens: hit
      ? tokenCorrection(row.reservedTokens, null, false)
      : tokenCorrection(row.reservedTokens, usedTokens, input.originBegan ?? true),
    spend: { reservedPicos: late ? 0n : -row.reservedPicos, settledPicos: cost },
    usage: [
      ...counted,
      // A hit's tokens were saved, not billed: the usage rollups count what was generated.
      {
        model,
        requests: late && model === row.model ? 0 : 1,
        tokens: hit ? null : tokens,
        costPicos: cost,
      },
    ],
  };
  const result: SettleResult = {
    settled: true,
    requestId: row.requestId,
    reservedTokens: row.reservedTokens,
    usedTokens,
    costPicos: cost,
    late,
  };
  return { change, result };
}

/**
 * An open row whose lease ran out, or whose edge could not learn what its origin generated
 * (`seen`: how the edge delivered it and how it ended for its client, kept for the
 * settlement the origins' records bring): its reservation released, counted as one request.
 */
export function expireRow(
  row: LedgerEntry,
  now: number,
  seen?: Pick<SettleInput, "attempts" | "metrics" | "outcome">,
): LedgerChange {
  const delivered = seen === undefined ? {} : deliveredAs(row, seen);
  return {
    row: {
      ...row,
      ...delivered,
      state: "expired",
      closedAt: now,
      outcome: seen?.outcome ?? "expired",
      costPicos: 0n,
    },
    tokens: 0,
    spend: { reservedPicos: -row.reservedPicos, settledPicos: 0n },
    usage: [{ model: row.model, requests: 1, tokens: null, costPicos: 0n }],
  };
}

/**
 * Notes on an expired row how its edge delivered the request and how it ended for its
 * client (`seen`); nothing else changes.
 */
export function deliveryNoted(
  row: LedgerEntry,
  seen: Pick<SettleInput, "attempts" | "metrics" | "outcome">,
): LedgerChange {
  return {
    row: { ...row, ...deliveredAs(row, seen), outcome: seen.outcome },
    tokens: 0,
    spend: { reservedPicos: 0n, settledPicos: 0n },
    usage: [],
  };
}

// The delivery a row records: the attempts, status, duration and time to first token the
// edge told, where it told them.
function deliveredAs(
  row: LedgerEntry,
  seen: Pick<SettleInput, "attempts" | "metrics">,
): Pick<LedgerEntry, "attempts" | "httpStatus" | "durationMs" | "ttftMs"> {
  const m = seen.metrics;
  return {
    attempts: seen.attempts ?? row.attempts,
    httpStatus: m?.status ?? row.httpStatus,
    durationMs: m?.durationMs ?? row.durationMs,
    ttftMs: m === undefined ? row.ttftMs : m.ttftMs,
  };
}

/** How the client saw a row's request, from what its row records; undefined if not told. */
export function rowMetrics(row: LedgerEntry): SettleMetrics | undefined {
  if (row.httpStatus === null) return undefined;
  const served = row.attempts.find((attempt) => attempt.result === "served");
  return {
    region: served?.region ?? null,
    status: row.httpStatus,
    durationMs: row.durationMs ?? 0,
    ttftMs: row.ttftMs,
  };
}

/**
 * The row of a request whose admission a crash forgot, from what the edge held of it:
 * nothing reserved, in the day it settles. Null when the edge does not say it admitted it.
 */
export function forgottenRow(
  input: SettleInput,
  key: { tags: readonly string[]; teamId: string | null },
  now: number,
): LedgerEntry | null {
  const first = input.admitted?.models[0];
  if (input.admitted === undefined || input.admitted === null || first === undefined) return null;
  return {
    requestId: input.requestId,
    state: "open",
    model: first.model,
    day: utcDay(now),
    hour: hourOf(now),
    subject: null,
    subjectTpm: null,
    endUser: null,
    tags: rowTags(key.tags, input.tags),
    teamId: key.teamId,
    reservedTokens: 0,
    reservedPicos: 0n,
    candidates: input.admitted.models.map(({ model, price }) => storedCandidate(model, price)),
    createdAt: now,
    expiresAt: now,
    ...NOT_CLOSED,
  };
}
