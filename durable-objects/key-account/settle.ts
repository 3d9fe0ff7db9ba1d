/**
 * Settling a request once: its open row closed with its real usage (billed within the
 * budgets' room), an expired one settled late, a forgotten one billed from what the edge
 * held of it (docs/key-account.md, "Keys and settlement").
 */
import { tokenCorrection, type PeriodSpend, type SpendState } from "./admission.ts";
import { NO_BUDGETS } from "./types.ts";
import { billingCap } from "./budgets.ts";
import { billedMicros, utcDay, type TokenUsage } from "../../contracts/pricing.ts";
import { KEY_SCOPE, NOT_CLOSED, type LedgerEntry, priceOf, storedCandidate } from "./schema.ts";
import { addSpend, addUsage, spendOf } from "./rollups.ts";
import { type AccountStore, userScope } from "./store.ts";
import type { SettleInput, SettleResult } from "./types.ts";

// --- settlement ------------------------------------------------------------------

/** Settles one request, exactly once (repeats answer why nothing changed). */
export function settle(store: AccountStore, input: SettleInput, now: number): SettleResult {
  const { requestId } = input;
  const budgets = store.record?.budgets ?? NO_BUDGETS;
  const open = store.open.get(requestId);
  if (open !== undefined) {
    // Exact, unless that would take a budget past its limit: the reservation was agreed at
    // admission, anything above it only while the budgets have room.
    const cap = billingCap(budgets, spendOf(store, open.day), open.reservedMicros);
    return close(store, open, input, now, cap);
  }
  // Not in flight: settled or expired already, or its admission was forgotten by a crash
  // before it was written. Rare, so the committed row is read.
  store.writes.flush();
  const row = store.ledgerRow(requestId);
  if (row === null) return settleForgotten(store, input, now);
  if (row.state === "settled") return { settled: false, requestId, reason: "already_settled" };
  if (row.state === "open") throw new Error(`open ledger row ${requestId} is not in memory`);
  // Expired: its reservation was released then, so it is billed only as far as budgets have room.
  return close(store, row, input, now, billingCap(budgets, spendOf(store, row.day), 0));
}

// Settles a request whose admission a crash forgot, from what the edge held of it: a
// settled row with nothing reserved, in the day it settles. A request the edge does not
// say it admitted is unknown.
function settleForgotten(store: AccountStore, input: SettleInput, now: number): SettleResult {
  const admitted = input.admitted ?? null;
  const first = admitted?.models[0];
  if (admitted === null || first === undefined) {
    return { settled: false, requestId: input.requestId, reason: "unknown_request" };
  }
  const day = utcDay(now);
  const entry: LedgerEntry = {
    requestId: input.requestId,
    state: "open",
    model: first.model,
    day,
    subject: null,
    subjectTpm: null,
    endUser: null,
    reservedTokens: 0,
    reservedMicros: 0,
    candidates: admitted.models.map(({ model, price }) => storedCandidate(model, price)),
    createdAt: now,
    expiresAt: now,
    ...NOT_CLOSED,
  };
  // As the admission agreed: its reservation in full, above it as far as the budgets have
  // room with that reservation counted, as it was before the crash.
  const reserved = Math.max(0, admitted.reservedMicros);
  const budgets = store.record?.budgets ?? NO_BUDGETS;
  const cap = billingCap(budgets, withReserved(spendOf(store, day), reserved), reserved);
  return close(store, entry, input, now, cap);
}

// Settles an open, expired or forgotten row at most `capMicros` (null: no cap).
function close(
  store: AccountStore,
  row: LedgerEntry,
  input: SettleInput,
  now: number,
  capMicros: number | null,
): SettleResult {
  const usage = input.usage ?? null;
  const usedTokens = usage === null ? null : usage.prompt_tokens + usage.completion_tokens;
  const delta = tokenCorrection(row.reservedTokens, usedTokens, input.originBegan ?? true);
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
  const late = row.state === "expired";
  const cost = billedMicros(tokens, priceOf(served), capMicros);
  if (delta !== 0) {
    store.adjustTokens(KEY_SCOPE, store.record?.limits.tpm ?? 0, delta, now);
    if (row.subject !== null && row.subjectTpm !== null) {
      store.adjustTokens(userScope(row.subject), row.subjectTpm, delta, now);
    }
  }
  store.untrackOpen(row);
  store.putLedger({
    ...row,
    state: "settled",
    closedAt: now,
    outcome: input.outcome,
    model,
    promptTokens: usage?.prompt_tokens ?? null,
    cachedTokens: usage === null ? null : (usage.cached_tokens ?? 0),
    completionTokens: usage?.completion_tokens ?? null,
    costMicros: cost,
  });
  // An expired row released its reservation and was counted when it expired.
  addSpend(store, row.day, {
    reservedMicros: late ? 0 : -row.reservedMicros,
    settledMicros: cost,
  });
  if (late && model !== row.model) addUsage(store, row.day, row.model, -1, null, 0);
  addUsage(store, row.day, model, late && model === row.model ? 0 : 1, tokens, cost);
  return {
    settled: true,
    requestId: row.requestId,
    reservedTokens: row.reservedTokens,
    usedTokens,
    costMicros: cost,
    late,
  };
}

// Spend as it would be with `micros` more reserved in each period.
function withReserved(spend: SpendState, micros: number): SpendState {
  const add = (period: PeriodSpend) => ({
    ...period,
    reservedMicros: period.reservedMicros + micros,
  });
  return { day: add(spend.day), month: add(spend.month), lifetime: add(spend.lifetime) };
}
