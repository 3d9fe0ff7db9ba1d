/**
 * `GET /admin/usage`: the usage API across keys (or one key's), by UTC day and model, of
 * one end user's requests (`user`), one tag's (`tag`) or one team's (`team_id`) when asked; and
 * `GET /admin/usage/tags`: spend per tag. Each key's account holds its own ledger: they are
 * asked a batch at a time. See docs/api.md.
 */
import { methodNotAllowed } from "../../error-handler.ts";
import { Hono } from "hono";
import { TAG_PATTERN } from "../../../contracts/tags.ts";
import {
  type TagUsageRow,
  type UsageQuery,
  type UsageRow,
  type UsageTotals,
} from "../../../durable-objects/key-account/usage-types.ts";
import { invalidRequest } from "../../../contracts/errors.ts";
import { keyAccount, keyDirectory } from "../../accounts/account-client.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import { noSuchKey } from "./keys.ts";
import { TEAM_ID_PATTERN } from "../../accounts/teams.ts";
import { budgetStatusJson } from "./key-payloads.ts";
import type { BudgetStatus } from "../../../durable-objects/key-account/budget-types.ts";
import {
  type UsageRange,
  sumUsage,
  totalsJson,
  usageRange,
  usageReport,
  usageUser,
} from "../usage.ts";
import { onlyParams } from "../query-params.ts";

/** Key accounts asked at once by `GET /admin/usage`. */
export const USAGE_FAN_OUT = 32;

type KeyUsage = {
  id: string;
  name: string;
  rows: UsageRow[];
  tags: TagUsageRow[];
  budgets: BudgetStatus[];
};

/** `/admin/usage` and `/admin/usage/tags`, mounted at `/admin/usage`. */
export const adminUsage = new Hono<{ Bindings: Env }>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    onlyParams(c.req.query(), ["from", "to", "key_id", "user", "tag", "team_id"]);
    const range = usageRange(c.req.query("from"), c.req.query("to"), Date.now());
    const user = usageUser(c.req.query("user"));
    const tag = usageTag(c.req.query("tag"));
    const teamId = usageTeam(c.req.query("team_id"));
    const perKey = await askKeys(c.env, c.req.query("key_id"), {
      ...range,
      ...(user !== undefined && { user }),
      ...(tag !== undefined && { tag }),
      ...(teamId !== undefined && { teamId }),
    });
    const members =
      teamId === undefined ? undefined : new Set(await keyDirectory(c.env).teamKeys(teamId));
    const rows = merge(
      perKey.flatMap((key) => key.rows),
      (row) => `${row.day}\u0000${row.model}`,
    ).sort((a, b) =>
      a.day === b.day ? a.model.localeCompare(b.model) : a.day.localeCompare(b.day),
    );
    return c.json({
      ...usageReport(range, rows),
      user: user ?? null,
      tag: tag ?? null,
      team_id: teamId ?? null,
      // Each key with requests in the range, or with budgets (their windows and resets); for
      // a team, only its keys now and those with requests in it in the range.
      keys: perKey
        .filter((key) => members === undefined || members.has(key.id) || key.rows.length > 0)
        .map((key) => ({
          key_id: key.id,
          name: key.name,
          ...totalsJson(sumUsage(key.rows)),
          budgets: budgetStatusJson(key.budgets),
        }))
        .filter((key) => key.requests > 0 || key.budgets.length > 0),
    });
  })
  .get("/tags", async (c) => {
    onlyParams(c.req.query(), ["from", "to", "key_id"]);
    const range = usageRange(c.req.query("from"), c.req.query("to"), Date.now());
    const perKey = await askKeys(c.env, c.req.query("key_id"), { ...range, by: "tag" });
    const tags = merge(
      perKey.flatMap((key) => key.tags),
      (row) => row.tag,
    ).sort((a, b) => a.tag.localeCompare(b.tag));
    return c.json({
      object: "list",
      from: range.from,
      to: range.to,
      data: tags.map((row) => ({ tag: row.tag, ...totalsJson(row) })),
    });
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]))
  .all("/tags", methodNotAllowed(["GET", "HEAD"]));

/** Reads `tag` (a tag as keys carry them); 400 for anything else. */
export function usageTag(tag: string | undefined): string | undefined {
  if (tag !== undefined && !TAG_PATTERN.test(tag)) {
    throw invalidRequest(
      "tag must be 1 to 64 letters, digits or _ . : = / @ + -.",
      "tag",
      "invalid_value",
    );
  }
  return tag;
}

/**
 * Reads `team_id`: any well-formed team id, the team's or a deleted one's (ledger rows outlive
 * the team and its keys' moves); 400 for anything else.
 */
export function usageTeam(teamId: string | undefined): string | undefined {
  if (teamId !== undefined && !TEAM_ID_PATTERN.test(teamId)) {
    throw invalidRequest("team_id must be a team id (team_…).", "team_id", "invalid_value");
  }
  return teamId;
}

// Every indexed key's account (or only `only`'s), a batch at a time.
async function askKeys(
  env: Env,
  only: string | undefined,
  query: UsageQuery & UsageRange,
): Promise<KeyUsage[]> {
  const all: { id: string; name: string }[] = await keyDirectory(env).ids();
  const keys = only === undefined ? all : all.filter((key) => key.id === only);
  if (only !== undefined && keys.length === 0) throw noSuchKey(only);
  const perKey: KeyUsage[] = [];
  for (let i = 0; i < keys.length; i += USAGE_FAN_OUT) {
    const batch = keys.slice(i, i + USAGE_FAN_OUT);
    const answers = await Promise.all(batch.map((key) => keyAccount(env, key.id).usage(query)));
    answers.forEach((answer, j) => {
      const key = batch[j];
      if (answer.ok && key !== undefined) {
        perKey.push({
          ...key,
          rows: answer.rows,
          tags: answer.tags ?? [],
          budgets: answer.budgets,
        });
      }
    });
  }
  return perKey;
}

// Rows of the same slot summed (in integers).
function merge<T extends UsageTotals>(rows: readonly T[], slotOf: (row: T) => string): T[] {
  const merged = new Map<string, T>();
  for (const row of rows) {
    const slot = slotOf(row);
    const seen = merged.get(slot);
    merged.set(slot, seen === undefined ? { ...row } : { ...seen, ...sumUsage([seen, row]) });
  }
  return [...merged.values()];
}
