/**
 * The account's reads for the edge and the admin API: a credential check without
 * admission, usage rollups (whole, one end user's, one tag's, per tag) and one request's
 * ledger record, each refused for a credential the key no longer accepts
 * (docs/key-account.md).
 */
import { keyRefusal } from "./admission.ts";
import { checkCredential } from "./credential.ts";
import { budgetStatuses } from "./budgets.ts";
import { usableModels } from "./team/pool.ts";
import { KEY_SCOPE, ledgerRecordOf } from "./schema.ts";
import type { AccountStore } from "./store.ts";
import { type CheckCredential, type KeyCheckResult } from "./types.ts";
import { type BudgetStatus, NO_BUDGETS } from "./budget-types.ts";
import type {
  LedgerRecord,
  RecordResult,
  RequestLogQuery,
  UsageQuery,
  UsageResult,
} from "./usage-types.ts";

/**
 * Checks a credential without admitting a request (nothing is reserved or counted): an
 * API key's hash, the key's status and expiry, and the browser origin if any; answers the
 * models the caller may use by admission's own rule (`usableModels`).
 */
export function checkKey(
  store: AccountStore,
  input: {
    credential: CheckCredential;
    origin?: string | null;
    /** A browser token's models (null or absent: every model the key may use). */
    models?: string[] | null;
    now?: number;
  },
): KeyCheckResult {
  const now = input.now ?? Date.now();
  const record = store.key.record;
  if (record === null) return { ok: false, code: "invalid_api_key", reason: "unknown" };
  const secret = checkCredential(store.key.secrets, input.credential, now);
  if (!secret.ok) return secret;
  const refusedKey = keyRefusal(record, input.origin ?? null, now);
  if (refusedKey !== null) return refusedKey;
  return {
    ok: true,
    record: store.key.view(now) ?? record,
    secretGeneration: secret.secretGeneration,
    models: usableModels(record.models, store.team.pool, input.models ?? null),
  };
}

/**
 * Usage from `from` to `to` (UTC days, inclusive): the rollups by day and model; with
 * `user`, `tag` or `teamId`, only those requests, summed from the ledger (kept LEDGER_RETENTION_MS);
 * with `by: "tag"`, totals per tag as well.
 */
export function usageOf(store: AccountStore, query: UsageQuery): UsageResult {
  if (query.credential !== undefined) {
    const check = checkKey(store, { credential: query.credential });
    if (!check.ok) return check;
  }
  const { from, to, user, tag, teamId } = query;
  const rows =
    user === undefined && tag === undefined && teamId === undefined
      ? store.spend.usage(from, to)
      : store.ledger.filteredUsage(
          {
            ...(user !== undefined && { user }),
            ...(tag !== undefined && { tag }),
            ...(teamId !== undefined && { teamId }),
          },
          from,
          to,
        );
  return {
    ok: true,
    rows,
    ...(query.by === "tag" && { tags: store.ledger.tagUsage(from, to) }),
    budgets: budgetStatusOf(store, Date.now()),
  };
}

/** The key's budgets as they stand at `now`: each window's spend and when it resets. */
export function budgetStatusOf(store: AccountStore, now: number): BudgetStatus[] {
  const budgets = store.key.record?.budgets ?? NO_BUDGETS;
  return budgetStatuses(store.spend.lines(budgets, now, KEY_SCOPE));
}

/** One request's ledger record (null when unknown or pruned), for its own key's secret. */
export function recordOf(
  store: AccountStore,
  input: { requestId: string; credential?: CheckCredential },
): RecordResult {
  if (input.credential !== undefined) {
    const check = checkKey(store, { credential: input.credential });
    if (!check.ok) return check;
  }
  const entry = store.ledger.committed(input.requestId);
  return { ok: true, record: entry === null ? null : ledgerRecordOf(entry) };
}

/** A page of the key's ledger rows, newest first, for the spend log. */
export function requestsOf(store: AccountStore, query: RequestLogQuery): LedgerRecord[] {
  return store.ledger.page(query).map(ledgerRecordOf);
}
