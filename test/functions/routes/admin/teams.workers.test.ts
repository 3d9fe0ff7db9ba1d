import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { ADMIN, createKey } from "../../../support/admin-keys.workers.ts";

function admin(path: string, init: { method?: string; body?: unknown } = {}) {
  return exports.default.fetch(`http://edge.test/admin${path}`, {
    method: init.method ?? "GET",
    headers: ADMIN,
    ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
  });
}

type TeamJson = {
  id: string;
  object: string;
  name: string;
  limits: { rpm: number; concurrency: number; credit_usd: number | null };
  budgets: { period: string; max_usd: number; soft_usd: number | null }[];
  models: string[] | null;
  tags: string[];
  key_ids?: string[];
  budget_status?: {
    period: string;
    max_usd: number;
    spent_usd: number;
    reserved_usd: number;
    resets_at: number | null;
  }[];
};
type ErrorJson = { error: { code: string; param: string | null; type: string; message: string } };

async function createTeam(body: Record<string, unknown>): Promise<TeamJson> {
  const res = await admin("/teams", { method: "POST", body });
  expect(res.status).toBe(201);
  return res.json<TeamJson>();
}

type UsageJson = {
  team_id: string;
  total: { requests: number };
  keys: { key_id: string; requests: number }[];
};

// A team's usage once `requests` of its requests are settled (a stream settles after its end).
async function settledUsage(teamId: string, requests: number): Promise<UsageJson> {
  let usage = await (await admin(`/usage?team_id=${teamId}`)).json<UsageJson>();
  for (let i = 0; i < 300 && usage.total.requests < requests; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
    usage = await (await admin(`/usage?team_id=${teamId}`)).json<UsageJson>();
  }
  return usage;
}

function chat(key: string) {
  return exports.default.fetch("http://edge.test/v1/chat/completions", {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    }),
  });
}

describe("/admin/teams", () => {
  it("creates, lists, reads, updates and deletes a team, each in the audit log", async () => {
    const team = await createTeam({
      name: "research",
      limits: { rpm: 100, concurrency: 4, credit_usd: 50 },
      budgets: [
        { period: "1d", max_usd: 5, soft_usd: 4 },
        { period: "7d", max_usd: 20 },
      ],
      tags: ["org:research"],
      metadata: { owner: "ana" },
    });
    expect(team).toMatchObject({ object: "team", name: "research", tags: ["org:research"] });
    expect(team.limits).toMatchObject({ rpm: 100, concurrency: 4, credit_usd: 50 });
    expect(team.budgets).toEqual([
      { period: "1d", max_usd: 5, soft_usd: 4 },
      { period: "7d", max_usd: 20, soft_usd: null },
    ]);
    const list = await (await admin("/teams?limit=100")).json<{ data: TeamJson[] }>();
    expect(list.data.map((one) => one.id)).toContain(team.id);
    const read = await (await admin(`/teams/${team.id}`)).json<TeamJson>();
    expect(read.key_ids).toEqual([]);
    const day = 86_400;
    const nextDay = (Math.floor(Date.now() / 1_000 / day) + 1) * day;
    expect(read.budget_status?.map((one) => one.period)).toEqual(["1d", "7d", "credit"]);
    expect(read.budget_status?.[0]).toMatchObject({
      max_usd: 5,
      spent_usd: 0,
      reserved_usd: 0,
      resets_at: nextDay,
    });
    expect(read.budget_status?.[2]).toMatchObject({ max_usd: 50, resets_at: null });
    const patched = await admin(`/teams/${team.id}`, {
      method: "PATCH",
      body: { name: "research-2", limits: { concurrency: 8 } },
    });
    expect(await patched.json()).toMatchObject({
      name: "research-2",
      limits: { concurrency: 8, rpm: 100, credit_usd: 50 },
      budgets: [{ period: "1d" }, { period: "7d" }],
    });
    const rebudgeted = await admin(`/teams/${team.id}`, {
      method: "PATCH",
      body: { budgets: [{ period: "month", max_usd: 100 }] },
    });
    expect(await rebudgeted.json()).toMatchObject({
      budgets: [{ period: "month", max_usd: 100, soft_usd: null }],
    });
    const badPeriod = await admin(`/teams/${team.id}`, {
      method: "PATCH",
      body: { budgets: [{ period: "2w", max_usd: 1 }] },
    });
    expect(badPeriod.status).toBe(400);
    expect((await badPeriod.json<ErrorJson>()).error.type).toBe("invalid_request_error");
    expect((await admin(`/teams/${team.id}`, { method: "DELETE" })).status).toBe(200);
    const gone = await admin(`/teams/${team.id}`);
    expect(gone.status).toBe(404);
    expect((await gone.json<ErrorJson>()).error.code).toBe("team_not_found");
    const audit = await (
      await admin(`/audit?target_id=${team.id}`)
    ).json<{ data: { action: string }[] }>();
    expect(audit.data.map((entry) => entry.action)).toEqual([
      "team.delete",
      "team.update",
      "team.update",
      "team.create",
    ]);
  });

  it("refuses a key's team_id that names no team", async () => {
    const res = await admin("/keys", {
      method: "POST",
      body: { name: "orphan", team_id: "team_aaaaaaaaaaaaaaaa" },
    });
    expect(res.status).toBe(404);
    expect((await res.json<ErrorJson>()).error).toMatchObject({
      code: "team_not_found",
      param: "team_id",
      type: "invalid_request_error",
    });
  });

  it("refuses a malformed team_id with invalid_value naming it", async () => {
    for (const method of ["POST", "PATCH"] as const) {
      const { id } = await createKey({ name: "malformed-team" });
      const res = await admin(method === "POST" ? "/keys" : `/keys/${id}`, {
        method,
        body: { name: "malformed", team_id: "team_nope" },
      });
      expect(res.status).toBe(400);
      expect((await res.json<ErrorJson>()).error).toMatchObject({
        code: "invalid_value",
        param: "team_id",
        type: "invalid_request_error",
      });
    }
  });

  it("refuses to delete a team with keys (409), until they leave it", async () => {
    const team = await createTeam({ name: "busy" });
    const { id } = await createKey({ name: "member", team_id: team.id });
    expect((await (await admin(`/teams/${team.id}`)).json<TeamJson>()).key_ids).toEqual([id]);
    const refused = await admin(`/teams/${team.id}`, { method: "DELETE" });
    expect(refused.status).toBe(409);
    const body = await refused.json<ErrorJson>();
    expect(body.error).toMatchObject({ code: "team_not_empty", type: "invalid_request_error" });
    expect(body.error.message).toContain(id);
    const moved = await admin(`/keys/${id}`, { method: "PATCH", body: { team_id: null } });
    expect(await moved.json()).toMatchObject({ team_id: null });
    expect((await admin(`/teams/${team.id}`, { method: "DELETE" })).status).toBe(200);
  });

  it("refuses a request past its team's requests per minute with a 429 naming the team, and records the team on its rows", async () => {
    const team = await createTeam({ name: "tiny", limits: { rpm: 1 } });
    const { key, id } = await createKey({ name: "member", team_id: team.id });
    const first = await chat(key);
    expect(first.status).toBe(200);
    await first.text();
    const second = await chat(key);
    expect(second.status).toBe(429);
    const body = await second.json<ErrorJson>();
    expect(body.error.code).toBe("rate_limit_exceeded");
    expect(body.error.message).toContain(`team ${team.id}`);
    expect(second.headers.get("retry-after")).not.toBeNull();
    const rows = await (
      await admin(`/requests?team_id=${team.id}`)
    ).json<{ data: { key_id: string; team_id: string }[] }>();
    expect(rows.data.length).toBeGreaterThan(0);
    expect(rows.data.every((row) => row.key_id === id && row.team_id === team.id)).toBe(true);
    const usage = await (await admin(`/usage?team_id=${team.id}`)).json<{ team_id: string }>();
    expect(usage.team_id).toBe(team.id);
  });

  it("answers a deleted team's spend by its id, and an empty one for a team never seen", async () => {
    const team = await createTeam({ name: "short-lived" });
    const { key, id } = await createKey({ name: "leaver", team_id: team.id });
    const ok = await chat(key);
    expect(ok.status).toBe(200);
    await ok.text();
    await admin(`/keys/${id}`, { method: "PATCH", body: { team_id: null } });
    expect((await admin(`/teams/${team.id}`, { method: "DELETE" })).status).toBe(200);
    const rows = await admin(`/requests?team_id=${team.id}`);
    expect(rows.status).toBe(200);
    const log = await rows.json<{ data: { key_id: string; team_id: string }[] }>();
    expect(log.data.length).toBe(1);
    expect(log.data[0]).toMatchObject({ key_id: id, team_id: team.id });
    expect((await admin(`/usage?team_id=${team.id}`)).status).toBe(200);
    expect(await settledUsage(team.id, 1)).toMatchObject({
      team_id: team.id,
      total: { requests: 1 },
    });
    const never = await admin("/requests?team_id=team_aaaaaaaaaaaaaaaa");
    expect(never.status).toBe(200);
    expect((await never.json<{ data: unknown[] }>()).data).toEqual([]);
    const malformed = await admin("/usage?team_id=team_nope");
    expect(malformed.status).toBe(400);
    expect((await malformed.json<ErrorJson>()).error).toMatchObject({
      code: "invalid_value",
      param: "team_id",
    });
  });

  it("lists in a team's usage only its keys and those that spent in it", async () => {
    const team = await createTeam({ name: "listed" });
    const member = await createKey({
      name: "member",
      team_id: team.id,
      budgets: [{ period: "1d", max_usd: 5 }],
    });
    const leaver = await createKey({ name: "leaver", team_id: team.id });
    const outsider = await createKey({
      name: "outsider",
      budgets: [{ period: "1d", max_usd: 5 }],
    });
    const spent = await chat(leaver.key);
    expect(spent.status).toBe(200);
    await spent.text();
    await admin(`/keys/${leaver.id}`, { method: "PATCH", body: { team_id: null } });
    const usage = await settledUsage(team.id, 1);
    expect(usage.keys.map((key) => key.key_id).sort()).toEqual([member.id, leaver.id].sort());
    expect(usage.keys.map((key) => key.key_id)).not.toContain(outsider.id);
  });

  it("takes soft budgets over any period and a webhook for their alerts, and refuses bad ones with the param that is wrong", async () => {
    const team = await createTeam({
      name: "alerting",
      budgets: [
        { period: "1h", max_usd: 1, soft_usd: 0.5 },
        { period: "30d", max_usd: 20, soft_usd: 15 },
      ],
      alert_webhook_url: "https://hooks.example.com/warmgate",
    });
    expect(team).toMatchObject({
      budgets: [
        { period: "1h", max_usd: 1, soft_usd: 0.5 },
        { period: "30d", max_usd: 20, soft_usd: 15 },
      ],
      alert_webhook_url: "https://hooks.example.com/warmgate",
    });
    const cleared = await admin(`/teams/${team.id}`, {
      method: "PATCH",
      body: { alert_webhook_url: null },
    });
    expect(await cleared.json()).toMatchObject({ alert_webhook_url: null, budgets: [{}, {}] });
    const cases: [Record<string, unknown>, string][] = [
      [{ budgets: [{ period: "1d", max_usd: 1, soft_usd: 2 }] }, "budgets[0].soft_usd"],
      [{ budgets: [{ period: "1d", max_usd: 1, soft_usd: 1 }] }, "budgets[0].soft_usd"],
      [{ budgets: [{ period: "1d", max_usd: 1, soft_usd: -1 }] }, "budgets[0].soft_usd"],
      [{ alert_webhook_url: "http://hooks.example.com/warmgate" }, "alert_webhook_url"],
    ];
    for (const [body, param] of cases) {
      for (const [path, method] of [
        ["/teams", "POST"],
        [`/teams/${team.id}`, "PATCH"],
      ] as const) {
        const bad = await admin(path, { method, body: { name: "x", ...body } });
        expect(bad.status).toBe(400);
        const error = (await bad.json<ErrorJson>()).error;
        expect(error).toMatchObject({ type: "invalid_request_error", param });
      }
    }
  });
});
