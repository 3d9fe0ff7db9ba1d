// The admin API for teams, mounted at `/admin`, behind the admin token: create, list, read,
// update and delete. Each team's TeamAccount is its source of truth; every change is then
// copied to the KeyDirectory with its audit entry. A team with keys cannot be deleted.
// See docs/api.md and docs/key-account.md ("Teams").

import { methodNotAllowed } from "../../error-handler.ts";
import { Hono } from "hono";
import { z } from "zod";
import type { TeamRecord, TeamView } from "../../../durable-objects/team-account/types.ts";
import { MAX_KEY_TAGS } from "../../../contracts/tags.ts";
import { ApiError } from "../../../contracts/errors.ts";
import { readJsonBody } from "../../request/json-body.ts";
import { checkKeyModels } from "../../accounts/key-models.ts";
import { keyDirectory } from "../../accounts/account-client.ts";
import { auditEntry } from "../../accounts/audit.ts";
import {
  TEAM_ID_PATTERN,
  newTeamId,
  noSuchTeam,
  teamAccount,
  teamNotEmpty,
} from "../../accounts/teams.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import {
  BudgetList,
  KeyLimits,
  Metadata,
  Tag,
  WebhookUrl,
  budgetJson,
  budgetStatusJson,
  budgetsOf,
  rateLimitsOf,
  seconds,
  usd,
} from "./key-payloads.ts";

/** Limits of a team when the create request names none: none that a key would meet first. */
export const DEFAULT_TEAM_LIMITS = {
  rpm: 1_000_000_000,
  tpm: 1_000_000_000_000,
  concurrency: 1_000_000,
};

const TeamFields = {
  name: z.string().trim().min(1).max(200),
  limits: KeyLimits.partial(),
  /** Budgets over periods, as a key's: `[{period, max_usd, soft_usd}]`. */
  budgets: BudgetList,
  models: z.array(z.string().min(1).max(256)).max(1_000).nullable(),
  tags: z.array(Tag).max(MAX_KEY_TAGS),
  metadata: Metadata,
  /** Where the team's soft-budget alerts go; null: the configuration's `alerts.webhook_url`. */
  alert_webhook_url: WebhookUrl.nullable(),
};

/** Body of `POST /admin/teams`: all but `name` optional. */
export const CreateTeamRequest = z.strictObject(TeamFields).partial().required({ name: true });

/** Body of `PATCH /admin/teams/{id}`: any subset of the create fields. */
export const UpdateTeamRequest = z.strictObject(TeamFields).partial();

/** `/admin/teams…`: create, list, read, update and delete teams. */
export const adminTeams = new Hono<{ Bindings: Env }>()
  .use("*", adminAuth())
  .post("/teams", async (c) => {
    const body = await readJsonBody(c.req.raw, CreateTeamRequest);
    if (body.models) checkKeyModels(c.env.WARMGATE_CONFIG, body.models);
    const id = newTeamId();
    const record = await teamAccount(c.env, id).create({
      id,
      name: body.name,
      limits: { ...DEFAULT_TEAM_LIMITS, ...rateLimitsOf(body.limits ?? {}) },
      budgets: { periods: [], creditMicros: null, ...budgetsOf(body.limits, body.budgets) },
      models: body.models ?? null,
      tags: [...new Set(body.tags ?? [])],
      metadata: body.metadata ?? {},
      alertWebhookUrl: body.alert_webhook_url ?? null,
      now: Date.now(),
    });
    if (record === null) throw new Error("team id already in use");
    await keyDirectory(c.env).upsertTeam(
      record,
      await auditEntry(c, "team.create", target(id), body),
    );
    return c.json(teamJson(record), 201);
  })
  .get("/teams", async (c) => {
    const limit = Number(c.req.query("limit") ?? "20");
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
      throw new ApiError(400, "limit must be an integer from 1 to 100.", {
        type: "invalid_request_error",
        param: "limit",
      });
    }
    const page = await keyDirectory(c.env).teams({ limit, after: c.req.query("after") ?? null });
    return c.json({
      object: "list",
      data: page.teams.map((team) => teamJson(team)),
      first_id: page.teams[0]?.id ?? null,
      last_id: page.teams.at(-1)?.id ?? null,
      has_more: page.hasMore,
    });
  })
  .get("/teams/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await teamKnown(c.env, id))) throw noSuchTeam(id);
    const view = await teamAccount(c.env, id).view();
    if (view === null) throw noSuchTeam(id);
    const keys = await keyDirectory(c.env).teamKeys(id);
    return c.json({ ...teamJson(view.record, view), key_ids: keys });
  })
  .patch("/teams/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await teamKnown(c.env, id))) throw noSuchTeam(id);
    const body = await readJsonBody(c.req.raw, UpdateTeamRequest);
    if (body.models) checkKeyModels(c.env.WARMGATE_CONFIG, body.models);
    const { name, limits, budgets, models, tags, metadata, alert_webhook_url: webhook } = body;
    const record = await teamAccount(c.env, id).update({
      now: Date.now(),
      ...(name === undefined ? {} : { name }),
      ...(limits === undefined ? {} : { limits: rateLimitsOf(limits) }),
      budgets: budgetsOf(limits, budgets),
      ...(models === undefined ? {} : { models }),
      ...(tags === undefined ? {} : { tags: [...new Set(tags)] }),
      ...(metadata === undefined ? {} : { metadata }),
      ...(webhook === undefined ? {} : { alertWebhookUrl: webhook }),
    });
    if (record === null) throw noSuchTeam(id);
    await keyDirectory(c.env).upsertTeam(
      record,
      await auditEntry(c, "team.update", target(id), body),
    );
    return c.json(teamJson(record));
  })
  .delete("/teams/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await teamKnown(c.env, id))) throw noSuchTeam(id);
    const audit = await auditEntry(c, "team.delete", target(id));
    const { removed, keys } = await keyDirectory(c.env).removeTeam(id, audit);
    if (!removed) throw teamNotEmpty(id, keys);
    await teamAccount(c.env, id).remove();
    return c.json({ id, object: "team.deleted", deleted: true });
  })
  .all("/teams", methodNotAllowed(["GET", "HEAD", "POST"]))
  .all("/teams/:id", methodNotAllowed(["GET", "HEAD", "PATCH", "DELETE"]));

/** Whether a team id is indexed: only those are looked up, so probing never creates a TeamAccount. */
export async function teamKnown(env: Env, id: string): Promise<boolean> {
  return TEAM_ID_PATTERN.test(id) && (await keyDirectory(env).hasTeam(id));
}

function target(id: string): { type: string; id: string } {
  return { type: "team", id };
}

/** A team as the admin API shows it; with each budget's spend and reset when `view` is given. */
function teamJson(record: TeamRecord, view?: TeamView): Record<string, unknown> {
  const { budgets } = record;
  return {
    id: record.id,
    object: "team",
    name: record.name,
    limits: { ...record.limits, credit_usd: usd(budgets.creditMicros) },
    budgets: budgets.periods.map(budgetJson),
    models: record.models,
    tags: record.tags,
    metadata: record.metadata,
    alert_webhook_url: record.alertWebhookUrl,
    created_at: seconds(record.createdAt),
    updated_at: seconds(record.updatedAt),
    ...(view !== undefined && {
      concurrency_held: view.slotsHeld,
      budget_status: budgetStatusJson(view.budgets),
    }),
  };
}
