/**
 * The usage API of the calling key, from its KeyAccount's ledger:
 * `GET /v1/usage?from=YYYY-MM-DD&to=YYYY-MM-DD` (totals per UTC day and model, default
 * today; `&user=U` for one end user's requests) and `GET /v1/usage/requests/{request_id}` (one request's record, by the
 * `x-request-id` it was answered with). Costs are in USD, exact (to the pico-dollar).
 * Streamed requests are billed here once their stream ended.
 * See docs/key-account.md.
 */
import { Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { apiKeyOnly } from "../middleware/api-key-only.ts";
import { keyAccount, refusalError } from "../accounts/account-client.ts";
import { logWarn } from "../../contracts/log.ts";
import type {
  LedgerRecord,
  UsageRow,
  UsageTotals,
} from "../../durable-objects/key-account/usage-types.ts";
import { picosToUsd, utcDay } from "../../contracts/pricing.ts";
import { methodNotAllowed } from "../error-handler.ts";
import { onlyParams } from "./query-params.ts";
import { budgetStatusJson } from "./admin/key-payloads.ts";
import { invalidRequest, notFound } from "../../contracts/errors.ts";
import { MAX_USER_LENGTH } from "../request/bounds.ts";

/** Longest range `GET /v1/usage` answers for, in days. */
export const MAX_USAGE_DAYS = 366;

const DATE = /^\d{4}-\d{2}-\d{2}$/;

/** An inclusive range of UTC days. */
export interface UsageRange {
  from: string;
  to: string;
}

/** Totals in the usage API's shape. */
export interface UsageTotalsJson {
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  cost_usd: number;
}

/** One day and model in the usage API's shape. */
export type UsageDataJson = UsageTotalsJson & { date: string; model: string };

/** Reads `user` (1 to {@link MAX_USER_LENGTH} characters); 400 for an empty or long one. */
export function usageUser(user: string | undefined): string | undefined {
  if (user !== undefined && (user.length === 0 || user.length > MAX_USER_LENGTH)) {
    throw invalidRequest(
      `user must be 1 to ${MAX_USER_LENGTH} characters.`,
      "user",
      "invalid_value",
    );
  }
  return user;
}

/** Reads `from` and `to` (default: today, UTC); 400 for a bad date or range. */
export function usageRange(
  from: string | undefined,
  to: string | undefined,
  now: number,
): UsageRange {
  const today = utcDay(now);
  const range = { from: from ?? to ?? today, to: to ?? from ?? today };
  for (const param of ["from", "to"] as const) {
    if (!isDate(range[param])) {
      throw invalidRequest(`${param} must be a date as YYYY-MM-DD.`, param, "invalid_date");
    }
  }
  const days = (Date.parse(range.to) - Date.parse(range.from)) / 86_400_000 + 1;
  if (days < 1) throw invalidRequest("from must not be after to.", "from", "invalid_date");
  if (days > MAX_USAGE_DAYS) {
    throw invalidRequest(
      `The range may span at most ${MAX_USAGE_DAYS} days.`,
      "from",
      "invalid_date",
    );
  }
  return range;
}

/** Sums rows (in integers) into totals. */
export function sumUsage(rows: readonly UsageTotals[]): UsageTotals {
  const total: UsageTotals = {
    requests: 0,
    promptTokens: 0,
    cachedTokens: 0,
    completionTokens: 0,
    costPicos: 0n,
  };
  for (const row of rows) {
    total.requests += row.requests;
    total.promptTokens += row.promptTokens;
    total.cachedTokens += row.cachedTokens;
    total.completionTokens += row.completionTokens;
    total.costPicos += row.costPicos;
  }
  return total;
}

/** Totals in the API's shape. */
export function totalsJson(totals: UsageTotals): UsageTotalsJson {
  return {
    requests: totals.requests,
    prompt_tokens: totals.promptTokens,
    cached_tokens: totals.cachedTokens,
    completion_tokens: totals.completionTokens,
    cost_usd: picosToUsd(totals.costPicos),
  };
}

/** The `GET /v1/usage` body for rollup rows. */
export function usageReport(range: UsageRange, rows: readonly UsageRow[]) {
  return {
    object: "list" as const,
    from: range.from,
    to: range.to,
    data: rows.map((row): UsageDataJson => ({
      date: row.day,
      model: row.model,
      ...totalsJson(row),
    })),
    total: totalsJson(sumUsage(rows)),
  };
}

/** One request's record in the API's shape; times in unix seconds. */
export function requestRecordJson(record: LedgerRecord) {
  const tokens =
    record.promptTokens === null ? null : record.promptTokens + (record.completionTokens ?? 0);
  return {
    object: "usage.request" as const,
    id: record.requestId,
    model: record.model,
    status: record.state,
    outcome: record.outcome,
    date: record.day,
    created_at: Math.floor(record.createdAt / 1_000),
    settled_at: record.closedAt === null ? null : Math.floor(record.closedAt / 1_000),
    user: record.endUser,
    tags: record.tags,
    prompt_tokens: record.promptTokens,
    cached_tokens: record.cachedTokens,
    completion_tokens: record.completionTokens,
    total_tokens: tokens,
    cost_usd: picosToUsd(record.costPicos),
    // While a request runs its worst case is held against the key's budgets.
    reserved_usd: record.state === "open" ? picosToUsd(record.reservedPicos) : 0,
    // Every origin tried for it, in order; only the one that served it is billed.
    attempts: record.attempts,
    // How its client saw it, once settled.
    http_status: record.httpStatus,
    latency_ms: record.durationMs,
    ttft_ms: record.ttftMs,
    // Answered from the response cache: its tokens were saved, its cost is the hit price.
    cache_hit: record.cacheHit,
  };
}

/**
 * Sends now the settlements of the key this isolate still holds for a call to carry, so
 * that a client reading its usage finds the requests it was just answered (another
 * isolate's reach the account within a tenth of a second). A failed call changes nothing:
 * each settlement's own timer sends it again.
 */
async function sendQueued(env: Env, edge: AppEnv["Variables"]["edge"], keyId: string) {
  const carried = edge.settlements.take(keyId);
  if (carried.inputs.length === 0) return;
  try {
    carried.answered((await keyAccount(env, keyId).settleMany(carried.inputs)).commit);
  } catch (error) {
    logWarn("settlements before a usage read failed", { key_id: keyId, error });
  }
}

/** The usage route group, mounted at `/v1/usage`. */
export const usage = new Hono<AppEnv>()
  .get("/", async (c) => {
    const credential = apiKeyOnly(c.var.credential, "read a key's usage");
    onlyParams(c.req.query(), ["from", "to", "user"]);
    const range = usageRange(c.req.query("from"), c.req.query("to"), Date.now());
    const user = usageUser(c.req.query("user"));
    await sendQueued(c.env, c.var.edge, credential.keyId);
    const result = await keyAccount(c.env, credential.keyId).usage({
      ...range,
      ...(user === undefined ? {} : { user }),
      credential: { kind: "key", secretHash: credential.secretHash },
    });
    if (!result.ok) throw refusalError(result, credential.keyId);
    return c.json({
      ...usageReport(range, result.rows),
      user: user ?? null,
      // The key's budgets now: each window's spend and when it resets.
      budgets: budgetStatusJson(result.budgets),
    });
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]))
  .get("/requests/:id", async (c) => {
    const credential = apiKeyOnly(c.var.credential, "read a key's usage");
    const requestId = c.req.param("id");
    await sendQueued(c.env, c.var.edge, credential.keyId);
    const result = await keyAccount(c.env, credential.keyId).record({
      requestId,
      credential: { kind: "key", secretHash: credential.secretHash },
    });
    if (!result.ok) throw refusalError(result, credential.keyId);
    if (result.record === null) {
      throw notFound(
        `No request with id ${requestId.slice(0, 64)} for this key.`,
        "request_not_found",
        "request_id",
      );
    }
    return c.json(requestRecordJson(result.record));
  })
  .all("/requests/:id", methodNotAllowed(["GET", "HEAD"]));

function isDate(value: string): boolean {
  if (!DATE.test(value)) return false;
  // Rejects days a month does not have (2026-02-30), which Date would roll over.
  const date = new Date(`${value}T00:00:00Z`);
  return !Number.isNaN(date.getTime()) && date.toISOString().startsWith(value);
}
