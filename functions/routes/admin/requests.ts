/**
 * `GET /admin/requests`: the spend log, every request's ledger row across keys (never a
 * prompt or an output), newest first, a page at a time (`cursor`), filtered by key, team, tag,
 * end user, model, status and time range, as JSON or CSV (`format=csv`). Each key's
 * account holds its own rows: every key asked for one page, merged (docs/api.md,
 * "Spend logs", says why).
 */
import { LEDGER_RETENTION_MS } from "../../../durable-objects/key-account/types.ts";
import { Hono } from "hono";
import {
  type LedgerRecord,
  type RequestLogQuery,
} from "../../../durable-objects/key-account/usage-types.ts";
import { invalidRequest } from "../../../contracts/errors.ts";
import { keyAccount, keyDirectory } from "../../accounts/account-client.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import { noSuchKey } from "./keys.ts";
import { USAGE_FAN_OUT, usageTag, usageTeam } from "./usage.ts";
import { requestRecordJson, usageUser } from "../usage.ts";
import { oneOf, onlyParams, whole } from "../query-params.ts";
import { methodNotAllowed } from "../../error-handler.ts";

const STATUSES = ["open", "settled", "expired"] as const;
const OUTCOMES = ["ok", "error", "cancelled", "timeout", "expired"] as const;
const FORMATS = ["json", "csv"] as const;
const PARAMS = [
  "limit",
  "cursor",
  "key_id",
  "team_id",
  "tag",
  "user",
  "model",
  "status",
  "outcome",
  "from",
  "to",
  "format",
];

type Row = LedgerRecord & { keyId: string };

/** `/admin/requests`, mounted at `/admin/requests`. */
export const adminRequests = new Hono<{ Bindings: Env }>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    const q = c.req.query();
    onlyParams(q, PARAMS);
    const now = Date.now();
    const format = oneOf(q, "format", FORMATS) ?? "json";
    const limit = whole(q["limit"] ?? "50", "limit", 1, 500);
    const user = usageUser(q["user"]);
    const tag = usageTag(q["tag"]);
    const teamId = usageTeam(q["team_id"]);
    const model = q["model"];
    if (model !== undefined && (model.length === 0 || model.length > 256)) {
      throw invalidRequest("model must be 1 to 256 characters.", "model", "invalid_value");
    }
    const status = oneOf(q, "status", STATUSES);
    const outcome = oneOf(q, "outcome", OUTCOMES);
    const from = instant(q["from"], "from") ?? now - LEDGER_RETENTION_MS;
    const to = instant(q["to"], "to") ?? now + 60_000;
    const before = q["cursor"] === undefined ? undefined : cursorOf(q["cursor"]);
    const query: RequestLogQuery = {
      limit,
      from,
      to,
      ...(before !== undefined && { before }),
      ...(user !== undefined && { user }),
      ...(tag !== undefined && { tag }),
      ...(teamId !== undefined && { teamId }),
      ...(model !== undefined && { model }),
      ...(status !== undefined && { status }),
      ...(outcome !== undefined && { outcome }),
    };
    const rows = await askKeys(c.env, q["key_id"], query);
    const page = rows.slice(0, limit);
    const last = page.at(-1);
    const next =
      rows.length > limit && last !== undefined ? cursorText(last.createdAt, last.requestId) : null;
    if (format === "csv") {
      return c.body(csv(page), 200, {
        "content-type": "text/csv; charset=utf-8",
        ...(next === null ? {} : { "x-warmgate-next-cursor": next }),
      });
    }
    return c.json({
      object: "list",
      data: page.map(rowJson),
      has_more: next !== null,
      next_cursor: next,
    });
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]));

// Every indexed key's account (or only `only`'s), a batch at a time; merged newest first.
async function askKeys(env: Env, only: string | undefined, query: RequestLogQuery): Promise<Row[]> {
  const all: { id: string }[] = await keyDirectory(env).ids();
  const keys = only === undefined ? all : all.filter((key) => key.id === only);
  if (only !== undefined && keys.length === 0) throw noSuchKey(only);
  // One more than a page from each: whether there is more is then known.
  const ask = { ...query, limit: query.limit + 1 };
  const rows: Row[] = [];
  for (let i = 0; i < keys.length; i += USAGE_FAN_OUT) {
    const batch = keys.slice(i, i + USAGE_FAN_OUT);
    const answers = await Promise.all(batch.map((key) => keyAccount(env, key.id).requests(ask)));
    answers.forEach((answer, j) => {
      const keyId = batch[j]?.id ?? "";
      for (const record of answer) rows.push({ ...record, keyId });
    });
  }
  return rows.sort((a, b) =>
    a.createdAt === b.createdAt
      ? b.requestId.localeCompare(a.requestId)
      : b.createdAt - a.createdAt,
  );
}

function rowJson(row: Row) {
  const served = row.attempts.find((attempt) => attempt.result === "served");
  return {
    ...requestRecordJson(row),
    key_id: row.keyId,
    team_id: row.teamId,
    region: served?.region ?? null,
    origin: served?.origin ?? null,
  };
}

const CSV_COLUMNS = [
  "id",
  "key_id",
  "team_id",
  "created_at",
  "model",
  "status",
  "outcome",
  "http_status",
  "user",
  "tags",
  "prompt_tokens",
  "cached_tokens",
  "completion_tokens",
  "cost_usd",
  "latency_ms",
  "ttft_ms",
  "region",
  "origin",
  "attempts",
] as const;

function csv(rows: readonly Row[]): string {
  const lines = rows.map((row) => {
    const json = rowJson(row);
    const values: Record<(typeof CSV_COLUMNS)[number], unknown> = {
      ...json,
      created_at: new Date(row.createdAt).toISOString(),
      tags: row.tags.join(" "),
      attempts: row.attempts.length,
    };
    return CSV_COLUMNS.map((column) => csvField(values[column])).join(",");
  });
  return [CSV_COLUMNS.join(","), ...lines].join("\r\n") + "\r\n";
}

// RFC 4180 quoting; a text starting like a formula is prefixed with `'` so that a
// spreadsheet shows it rather than runs it (OWASP, "CSV injection").
function csvField(value: unknown): string {
  if (typeof value !== "string" && typeof value !== "number") return "";
  let text = String(value);
  if (typeof value === "string" && /^[=+\-@\t\r]/.test(text)) text = `'${text}`;
  return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

function cursorText(createdAt: number, requestId: string): string {
  return btoa(JSON.stringify([createdAt, requestId])).replaceAll("=", "");
}

function cursorOf(text: string): { createdAt: number; requestId: string } {
  try {
    const [createdAt, requestId] = JSON.parse(atob(text)) as unknown[];
    if (typeof createdAt === "number" && typeof requestId === "string") {
      return { createdAt, requestId };
    }
  } catch {
    // Falls through to the 400 below.
  }
  throw invalidRequest("cursor is not one this API answered.", "cursor", "invalid_value");
}

// Unix seconds or an ISO 8601 date-time, as epoch ms.
function instant(value: string | undefined, param: string): number | undefined {
  if (value === undefined) return undefined;
  const ms = /^\d{1,12}$/.test(value) ? Number(value) * 1_000 : Date.parse(value);
  if (!Number.isFinite(ms) || !/^\d|^\d{4}-/.test(value)) {
    throw invalidRequest(
      `${param} must be unix seconds or an ISO 8601 date-time.`,
      param,
      "invalid_date",
    );
  }
  return ms;
}
