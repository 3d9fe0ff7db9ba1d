import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { ADMIN, createKey } from "../../../support/admin-keys.workers.ts";

function admin(path: string, init: { method?: string; body?: unknown; actor?: string } = {}) {
  return exports.default.fetch(`http://edge.test/admin${path}`, {
    method: init.method ?? "GET",
    headers: {
      ...ADMIN,
      ...(init.actor === undefined ? {} : { "x-warmgate-actor": init.actor }),
    },
    ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
  });
}

function models(key: string) {
  return exports.default.fetch("http://edge.test/v1/models", {
    headers: { authorization: `Bearer ${key}` },
  });
}

type AuditJson = {
  data: {
    id: number;
    action: string;
    actor: { credential: string; name: string | null };
    target: { type: string; id: string };
    detail: Record<string, unknown>;
  }[];
  has_more: boolean;
  last_id: number | null;
};

describe("blocking a key", () => {
  it("refuses its requests with an OpenAI-shaped 403 until it is unblocked", async () => {
    const { id, key } = await createKey({ name: "block-me" });
    expect((await models(key)).status).toBe(200);
    const blocked = await admin(`/keys/${id}/block`, { method: "POST" });
    expect(blocked.status).toBe(200);
    const shown = await blocked.json<{ status: string; blocked_at: number | null }>();
    expect(shown.status).toBe("blocked");
    expect(shown.blocked_at).toBeGreaterThan(0);
    const refused = await models(key);
    expect(refused.status).toBe(403);
    expect(await refused.json()).toEqual({
      error: {
        message: `API key ${id} is blocked: its operator has stopped its requests until it is unblocked.`,
        type: "permission_error",
        param: null,
        code: "key_blocked",
      },
    });
    const unblocked = await admin(`/keys/${id}/unblock`, { method: "POST" });
    expect(await unblocked.json()).toMatchObject({ status: "active", blocked_at: null });
    expect((await models(key)).status).toBe(200);
  });

  it("blocks and unblocks with PATCH `blocked`, keeping every other field", async () => {
    const { id, key } = await createKey({ name: "patch-block", limits: { rpm: 77 } });
    const res = await admin(`/keys/${id}`, { method: "PATCH", body: { blocked: true } });
    expect(await res.json()).toMatchObject({ status: "blocked", limits: { rpm: 77 } });
    expect((await models(key)).status).toBe(403);
    await admin(`/keys/${id}`, { method: "PATCH", body: { blocked: false } });
    expect((await models(key)).status).toBe(200);
  });

  it("refuses to block or unblock a revoked key (409), which stays revoked", async () => {
    const { id, key } = await createKey({ name: "revoked-block" });
    await admin(`/keys/${id}`, { method: "DELETE" });
    for (const path of [`/keys/${id}/block`, `/keys/${id}/unblock`]) {
      const res = await admin(path, { method: "POST" });
      expect(res.status).toBe(409);
      expect(await res.json()).toMatchObject({ error: { code: "key_revoked", param: "id" } });
    }
    const patched = await admin(`/keys/${id}`, { method: "PATCH", body: { blocked: false } });
    expect(patched.status).toBe(409);
    expect((await models(key)).status).toBe(401);
  });

  it("answers 404 for an unknown key and 400 for a non-boolean `blocked`", async () => {
    expect((await admin("/keys/aaaaaaaaaaaaaaaa/block", { method: "POST" })).status).toBe(404);
    const { id } = await createKey({ name: "bad-block" });
    const res = await admin(`/keys/${id}`, { method: "PATCH", body: { blocked: "yes" } });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({
      error: { type: "invalid_request_error", param: "blocked" },
    });
  });
});

describe("the audit log", () => {
  it("records who did what to which key, newest first, without any secret", async () => {
    const { id, key } = await createKey({ name: "audited" });
    await admin(`/keys/${id}/block`, { method: "POST", actor: "alice@example.com" });
    await admin(`/keys/${id}`, { method: "PATCH", body: { name: "audited-2" } });
    await admin(`/keys/${id}/rotate`, { method: "POST", body: { grace_seconds: 0 } });
    await admin(`/keys/${id}`, { method: "DELETE" });
    const res = await admin(`/audit?target_id=${id}`);
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text).not.toContain(key);
    const page = JSON.parse(text) as AuditJson;
    expect(page.data.map((entry) => entry.action)).toEqual([
      "key.revoke",
      "key.rotate",
      "key.update",
      "key.block",
      "key.create",
    ]);
    const [revoke, rotate, update, block, create] = page.data;
    expect(block?.actor.name).toBe("alice@example.com");
    expect(revoke?.actor.name).toBeNull();
    expect(create?.actor.credential).toMatch(/^admin:[0-9a-f]{8}$/);
    expect(create?.target).toEqual({ type: "key", id });
    expect(create?.detail).toMatchObject({ name: "audited" });
    expect(update?.detail).toEqual({ name: "audited-2" });
    expect(rotate?.detail).toEqual({ grace_seconds: 0 });
  });

  it("pages with `limit` and `before`, and filters by action", async () => {
    const { id } = await createKey({ name: "audit-pages" });
    await admin(`/keys/${id}/block`, { method: "POST" });
    await admin(`/keys/${id}/unblock`, { method: "POST" });
    const first = await (await admin(`/audit?target_id=${id}&limit=2`)).json<AuditJson>();
    expect(first.data.map((entry) => entry.action)).toEqual(["key.unblock", "key.block"]);
    expect(first.has_more).toBe(true);
    const next = await (
      await admin(`/audit?target_id=${id}&limit=2&before=${first.last_id}`)
    ).json<AuditJson>();
    expect(next.data.map((entry) => entry.action)).toEqual(["key.create"]);
    expect(next.has_more).toBe(false);
    const blocks = await (await admin(`/audit?action=key.block&limit=500`)).json<AuditJson>();
    expect(blocks.data.every((entry) => entry.action === "key.block")).toBe(true);
  });

  it("refuses bad parameters with a 400 and no token with a 401", async () => {
    for (const query of ["limit=0", "limit=501", "before=x", "colour=red", "action=key.delete"]) {
      const res = await admin(`/audit?${query}`);
      expect(res.status).toBe(400);
      expect(await res.json()).toMatchObject({ error: { type: "invalid_request_error" } });
    }
    const unknown = await (await admin("/audit?action=key.created")).json();
    expect(unknown).toMatchObject({
      error: { param: "action", message: expect.stringContaining("key.create, key.update") },
    });
    expect((await exports.default.fetch("http://edge.test/admin/audit")).status).toBe(401);
  });
});
