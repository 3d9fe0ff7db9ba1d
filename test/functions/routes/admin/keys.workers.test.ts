import { exports } from "cloudflare:workers";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { authenticateBearer } from "../../../../functions/accounts/account-client.ts";
import { EdgeState } from "../../../../functions/edge-state.ts";

// This file's own isolate state (keys checked, settlements queued).
const edge = new EdgeState(env);

const ADMIN = { authorization: "Bearer test-admin-token" };

function admin(path: string, init: { method?: string; body?: unknown } = {}) {
  return exports.default.fetch(`http://edge.test/admin${path}`, {
    method: init.method ?? "GET",
    headers: { ...ADMIN, "content-type": "application/json" },
    ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
  });
}

type KeyJson = {
  id: string;
  key?: string;
  name: string;
  status: string;
  limits: {
    rpm: number;
    tpm: number;
    concurrency: number;
    credit_usd?: number | null;
  };
  budgets?: { period: string; max_usd: number; soft_usd: number | null }[];
  allowed_origins: string[];
  models: string[] | null;
  tier: string;
  expires_at: number | null;
  previous_key_expires_at: number | null;
};

async function createKey(body: Record<string, unknown> = { name: "app" }): Promise<KeyJson> {
  const res = await admin("/keys", { method: "POST", body });
  expect(res.status).toBe(201);
  return res.json<KeyJson>();
}

async function admitWith(key: string, requestId: string) {
  const auth = await authenticateBearer(env, `Bearer ${key}`, {
    now: Date.now(),
    apiKeys: edge.apiKeys,
    browserTokens: edge.browserTokens,
  });
  if (!auth.ok) return auth.error.code;
  const account = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(auth.keyId));
  const result = await account.admit({
    requestId,
    credential:
      auth.kind === "key"
        ? { kind: "key", secretHash: auth.secretHash }
        : {
            kind: "browser",
            secretGeneration: auth.scope.secretGeneration,
            subject: "x",
            limits: auth.scope.limits,
            models: null,
          },
    model: "m",
    promptTokens: 1,
    maxTokens: 1,
  });
  return result.ok ? "ok" : result.code;
}

describe("admin API authentication", () => {
  it("refuses a missing admin token with an OpenAI-shaped 401", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys");
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({
      error: {
        message: "Missing or incorrect admin token.",
        type: "invalid_request_error",
        param: null,
        code: "invalid_admin_token",
      },
    });
  });

  it("refuses a wrong admin token, and an API key used as one", async () => {
    for (const authorization of ["Bearer wrong", "Bearer test-admin-token-", "test-admin-token"]) {
      const res = await exports.default.fetch("http://edge.test/admin/keys", {
        method: "POST",
        headers: { authorization },
        body: JSON.stringify({ name: "x" }),
      });
      expect(res.status).toBe(401);
    }
  });
});

describe("admin API keys", () => {
  it("creates a key with defaults and shows the secret only once", async () => {
    const created = await createKey({ name: "frontend" });
    expect(created).toMatchObject({
      object: "api_key",
      name: "frontend",
      status: "active",
      tier: "standard",
      models: null,
      allowed_origins: [],
      expires_at: null,
    });
    expect(created.key).toMatch(new RegExp(`^wg_${created.id}_`));
    const fetched = await (await admin(`/keys/${created.id}`)).json<KeyJson>();
    expect(fetched.id).toBe(created.id);
    expect(fetched.key).toBeUndefined();
    expect(JSON.stringify(fetched)).not.toContain(created.key);
    expect(await admitWith(created.key ?? "", "r1")).toBe("ok");
  });

  it("creates a key with every field", async () => {
    const expires = Math.floor(Date.now() / 1_000) + 3_600;
    const created = await createKey({
      name: "full",
      limits: { rpm: 5, tpm: 500, concurrency: 2 },
      allowed_origins: ["https://app.example", "http://localhost:3000"],
      models: ["warmgate-sim-8b", "warmgate-sim-70b"],
      tier: "high",
      expires_at: expires,
    });
    expect(created).toMatchObject({
      limits: { rpm: 5, tpm: 500, concurrency: 2 },
      allowed_origins: ["https://app.example", "http://localhost:3000"],
      models: ["warmgate-sim-8b", "warmgate-sim-70b"],
      tier: "high",
      expires_at: expires,
    });
  });

  it("rejects invalid bodies with a 400 naming the field", async () => {
    for (const [body, param] of [
      [{}, "name"],
      [{ name: "x", limits: { rpm: 0 } }, "limits.rpm"],
      [{ name: "x", allowed_origins: ["https://app.example/path"] }, "allowed_origins[0]"],
      [{ name: "x", tier: "gold" }, "tier"],
      [{ name: "x", unknown: 1 }, null],
      [{ name: "x", models: ["warmgate-sim-8b", "llama-3.1-8b-instruct"] }, "models[1]"],
      [{ name: "x", models: ["fast"] }, "models[0]"],
    ] as const) {
      const res = await admin("/keys", { method: "POST", body });
      expect(res.status).toBe(400);
      const { error } = await res.json<{ error: { type: string; param: string | null } }>();
      expect(error).toMatchObject({ type: "invalid_request_error", param });
    }
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: ADMIN,
      body: "{not json",
    });
    expect(res.status).toBe(400);
  });

  it("refuses models the gateway does not serve, on create and on update, naming the served ones", async () => {
    const res = await admin("/keys", {
      method: "POST",
      body: { name: "typo", models: ["llama-3.1-8b-instruct"] },
    });
    expect(res.status).toBe(400);
    const { error } = await res.json<{ error: { message: string; code: string } }>();
    expect(error.code).toBe("model_not_found");
    expect(error.message).toContain("warmgate-sim-8b");
    const created = await createKey({ name: "patch-typo" });
    const patched = await admin(`/keys/${created.id}`, {
      method: "PATCH",
      body: { models: ["nope"] },
    });
    expect(patched.status).toBe(400);
    const alias = await admin("/keys", {
      method: "POST",
      body: { name: "alias", models: ["fast"] },
    });
    const aliasError = await alias.json<{ error: { message: string } }>();
    expect(aliasError.error.message).toContain("alias");
  });

  it("updates limits and keeps the other fields", async () => {
    const created = await createKey({ name: "patch-me", limits: { rpm: 5 } });
    const res = await admin(`/keys/${created.id}`, {
      method: "PATCH",
      body: { limits: { tpm: 123 }, models: ["warmgate-sim-70b"] },
    });
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({
      name: "patch-me",
      limits: { rpm: 5, tpm: 123 },
      models: ["warmgate-sim-70b"],
    });
  });

  it("takes budgets over any period in US dollars, and replaces the list on PATCH", async () => {
    const created = await createKey({
      name: "budgets",
      limits: { rpm: 5, credit_usd: 0.000001 },
      budgets: [
        { period: "1h", max_usd: 1 },
        { period: "7d", max_usd: 20, soft_usd: 15 },
        { period: "month", max_usd: 40 },
      ],
    });
    expect(created.limits).toMatchObject({ rpm: 5, credit_usd: 0.000001 });
    expect(created.budgets).toEqual([
      { period: "1h", max_usd: 1, soft_usd: null },
      { period: "7d", max_usd: 20, soft_usd: 15 },
      { period: "month", max_usd: 40, soft_usd: null },
    ]);
    const res = await admin(`/keys/${created.id}`, {
      method: "PATCH",
      body: { limits: { credit_usd: 100 }, budgets: [{ period: "30d", max_usd: 2.5 }] },
    });
    const patched = await res.json<KeyJson>();
    expect(patched.limits).toMatchObject({ rpm: 5, credit_usd: 100 });
    expect(patched.budgets).toEqual([{ period: "30d", max_usd: 2.5, soft_usd: null }]);
    // A PATCH without `budgets` keeps them.
    const renamed = await admin(`/keys/${created.id}`, { method: "PATCH", body: { name: "b2" } });
    expect((await renamed.json<KeyJson>()).budgets).toHaveLength(1);
  });

  it("shows each budget's window, spend and reset time on GET", async () => {
    const created = await createKey({
      name: "status",
      budgets: [
        { period: "1h", max_usd: 1 },
        { period: "month", max_usd: 40 },
      ],
    });
    const res = await admin(`/keys/${created.id}`);
    const body = await res.json<{ budget_status: Record<string, unknown>[] }>();
    const now = new Date();
    const hourEnd = Math.ceil((now.getTime() + 1) / 3_600_000) * 3_600;
    const monthEnd = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1) / 1_000;
    expect(body.budget_status).toEqual([
      {
        period: "1h",
        max_usd: 1,
        soft_usd: null,
        spent_usd: 0,
        reserved_usd: 0,
        window_start: hourEnd - 3_600,
        resets_at: hourEnd,
      },
      expect.objectContaining({ period: "month", resets_at: monthEnd }),
    ]);
  });

  it("refuses a bad budget with the param that is wrong", async () => {
    const cases: [unknown, string][] = [
      [[{ period: "1w", max_usd: 1 }], "budgets[0].period"],
      [[{ period: "32d", max_usd: 1 }], "budgets[0].period"],
      [[{ period: "1d", max_usd: 0.0000001 }], "budgets[0].max_usd"],
      [[{ period: "1d", max_usd: 1, soft_usd: 2 }], "budgets[0].soft_usd"],
      [
        [
          { period: "1d", max_usd: 1 },
          { period: "1d", max_usd: 2 },
        ],
        "budgets",
      ],
    ];
    for (const [budgets, param] of cases) {
      const bad = await admin("/keys", { method: "POST", body: { name: "x", budgets } });
      expect(bad.status).toBe(400);
      expect((await bad.json<{ error: { param: string } }>()).error.param).toBe(param);
    }
  });

  it("takes per-model limits for configured models only", async () => {
    const created = await createKey({
      name: "per-model",
      model_limits: { "warmgate-sim-70b": { rpm: 3 } },
    });
    expect(created).toMatchObject({
      model_limits: { "warmgate-sim-70b": { rpm: 3, tpm: null } },
    });
    const bad = await admin("/keys", {
      method: "POST",
      body: { name: "x", model_limits: { "no-such-model": { rpm: 3 } } },
    });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({
      error: { code: "model_not_found", param: "model_limits.no-such-model" },
    });
    const empty = await admin("/keys", {
      method: "POST",
      body: { name: "x", model_limits: { "warmgate-sim-70b": {} } },
    });
    expect(empty.status).toBe(400);
  });

  it("revokes a key: its very next request is refused", async () => {
    const created = await createKey({ name: "revoke-me" });
    expect(await admitWith(created.key ?? "", "r1")).toBe("ok");
    const res = await admin(`/keys/${created.id}`, { method: "DELETE" });
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ status: "revoked" });
    expect(await admitWith(created.key ?? "", "r2")).toBe("invalid_api_key");
    // A revoked key stays as it was revoked: no change, not even its name.
    const renamed = await admin(`/keys/${created.id}`, { method: "PATCH", body: { name: "new" } });
    expect(renamed.status).toBe(409);
    expect(await renamed.json()).toMatchObject({ error: { code: "key_revoked" } });
    const record = await (await admin(`/keys/${created.id}`)).json<KeyJson>();
    expect(record).toMatchObject({ name: "revoke-me", status: "revoked" });
  });

  it("refuses an expiry in the past, on create and on update, and leaves the key working", async () => {
    const created = await createKey({ name: "expiring" });
    for (const expires_at of [1, Math.floor(Date.now() / 1_000) - 60]) {
      const made = await admin("/keys", { method: "POST", body: { name: "late", expires_at } });
      const patched = await admin(`/keys/${created.id}`, { method: "PATCH", body: { expires_at } });
      for (const res of [made, patched]) {
        expect(res.status).toBe(400);
        expect(await res.json()).toMatchObject({
          error: { type: "invalid_request_error", param: "expires_at", code: "invalid_value" },
        });
      }
    }
    const record = await (await admin(`/keys/${created.id}`)).json<KeyJson>();
    expect(record).toMatchObject({ status: "active", expires_at: null });
  });

  it("rotates a key: both secrets work during the grace period", async () => {
    const created = await createKey({ name: "rotate-me" });
    const res = await admin(`/keys/${created.id}/rotate`, {
      method: "POST",
      body: { grace_seconds: 600 },
    });
    expect(res.status).toBe(200);
    const rotated = await res.json<KeyJson>();
    expect(rotated.key).not.toBe(created.key);
    expect(rotated.previous_key_expires_at).toBeGreaterThan(Date.now() / 1_000 + 590);
    expect(await admitWith(created.key ?? "", "old")).toBe("ok");
    expect(await admitWith(rotated.key ?? "", "new")).toBe("ok");
  });

  it("rotates with no grace: the old secret stops at once", async () => {
    const created = await createKey({ name: "rotate-now" });
    const rotated = await (
      await admin(`/keys/${created.id}/rotate`, { method: "POST", body: { grace_seconds: 0 } })
    ).json<KeyJson>();
    expect(await admitWith(created.key ?? "", "old")).toBe("invalid_api_key");
    expect(await admitWith(rotated.key ?? "", "new")).toBe("ok");
  });

  it("answers 404 for unknown and malformed ids", async () => {
    expect((await admin("/keys/aaaaaaaaaaaaaaaa")).status).toBe(404);
    expect((await admin("/keys/not-an-id")).status).toBe(404);
    expect((await admin("/keys/aaaaaaaaaaaaaaaa", { method: "DELETE" })).status).toBe(404);
  });

  it("lists keys newest first, a page at a time", async () => {
    const made: string[] = [];
    for (let i = 0; i < 3; i++) made.push((await createKey({ name: `list-${i}` })).id);
    type Page = { object: string; data: KeyJson[]; has_more: boolean; last_id: string | null };
    const seen: string[] = [];
    let after: string | null = null;
    for (let guard = 0; guard < 100; guard++) {
      const query: string = after === null ? "?limit=2" : `?limit=2&after=${after}`;
      const page: Page = await (await admin(`/keys${query}`)).json<Page>();
      expect(page.object).toBe("list");
      expect(page.data.length).toBeLessThanOrEqual(2);
      seen.push(...page.data.map((k) => k.id));
      if (!page.has_more) break;
      after = page.last_id;
    }
    for (const id of made) expect(seen).toContain(id);
    expect(new Set(seen).size).toBe(seen.length);
    const page = await (await admin("/keys?limit=100")).text();
    expect(page).not.toContain('"key"');
  });
});
