import { exports } from "cloudflare:workers";
import { env } from "cloudflare:workers";
import { sign } from "hono/jwt";
import { describe, expect, it } from "vitest";
import { mintBrowserToken, verifyBrowserToken } from "../../../functions/accounts/browser-token.ts";
import { admitRequest, authenticateBearer } from "../../../functions/accounts/account-client.ts";
import { hex } from "../../../contracts/hashing.ts";
import { deriveSecret, newKeyId } from "../../../functions/accounts/keys.ts";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { EdgeState } from "../../../functions/edge-state.ts";

// This file's own isolate state (keys checked, settlements queued).
const edge = new EdgeState(env);

const SCOPE = { rpm: 10, tpm: 10_000, concurrency: 1 };

function mint(key: string, body: unknown = {}) {
  return exports.default.fetch("http://edge.test/v1/tokens", {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

type Minted = {
  token: string;
  expires_at: number;
  limits: { rpm: number; tpm: number; concurrency: number };
  models: string[] | null;
};

describe("POST /v1/tokens", () => {
  it("mints a token scoped to the key, an end user, narrower limits and models", async () => {
    const { id, key } = await createKey({
      name: "web",
      limits: { rpm: 100, tpm: 50_000, concurrency: 5 },
      models: ["warmgate-sim-8b", "warmgate-sim-70b"],
      allowed_origins: ["https://app.example"],
    });
    const before = Math.floor(Date.now() / 1_000);
    const res = await mint(key, {
      user: "alice",
      ttl_seconds: 600,
      limits: { rpm: 10, tpm: 1_000_000 },
      models: ["warmgate-sim-8b"],
    });
    expect(res.status).toBe(200);
    const minted = await res.json<Minted>();
    expect(minted.expires_at).toBeGreaterThanOrEqual(before + 600);
    expect(minted.expires_at).toBeLessThanOrEqual(before + 601);
    // Never wider than the key: tpm is capped at the key's.
    expect(minted.limits).toEqual({ rpm: 10, tpm: 50_000, concurrency: 5 });
    expect(minted.models).toEqual(["warmgate-sim-8b"]);
    const scope = await verifyBrowserToken(env, minted.token, Date.now(), edge.browserTokens);
    expect(scope).toMatchObject({
      keyId: id,
      user: "alice",
      subject: "user:alice",
      models: ["warmgate-sim-8b"],
      origins: ["https://app.example"],
      secretGeneration: 1,
    });
  });

  it("refuses a model the key does not allow, and a ttl over an hour", async () => {
    const { key } = await createKey({ name: "narrow", models: ["warmgate-sim-8b"] });
    expect((await mint(key, { models: ["warmgate-sim-70b"] })).status).toBe(400);
    const unknown = await mint(key, { models: ["warmgate-sim-9000"] });
    expect(unknown.status).toBe(400);
    expect((await unknown.json<{ error: unknown }>()).error).toMatchObject({
      code: "model_not_found",
      param: "models[0]",
    });
    const long = await mint(key, { ttl_seconds: 3_601 });
    expect(long.status).toBe(400);
    expect((await long.json<{ error: unknown }>()).error).toEqual({
      message:
        "Invalid 'ttl_seconds': integer above maximum value. Expected a value <= 3600, but got 3601 instead.",
      type: "invalid_request_error",
      param: "ttl_seconds",
      code: "integer_above_max_value",
    });
  });

  it("refuses a model outside the token's models, naming the token", async () => {
    const { key } = await createKey({
      name: "web-narrow",
      models: ["warmgate-sim-8b", "warmgate-sim-70b"],
      allowed_origins: ["https://app.example"],
    });
    const { token } = await (await mint(key, { models: ["warmgate-sim-8b"] })).json<Minted>();
    const res = await exports.default.fetch("http://edge.test/v1/chat/completions", {
      method: "POST",
      headers: {
        authorization: `Bearer ${token}`,
        origin: "https://app.example",
        "content-type": "application/json",
      },
      body: JSON.stringify({
        model: "warmgate-sim-70b",
        max_tokens: 1,
        messages: [{ role: "user", content: "hi" }],
      }),
    });
    expect(res.status).toBe(403);
    expect((await res.json<{ error: unknown }>()).error).toMatchObject({
      code: "model_not_allowed",
      message: "This browser token may not use the model `warmgate-sim-70b`.",
    });
  });

  it("refuses minting with a forged, revoked or browser-token credential", async () => {
    const { id, key } = await createKey({ name: "mint-refusals" });
    const forged = key.slice(0, -1) + (key.at(-1) === "a" ? "b" : "a");
    const forgedRes = await mint(forged);
    expect(forgedRes.status).toBe(401);
    const body = await forgedRes.text();
    expect(body).toContain("invalid_api_key");
    expect(body).not.toContain(forged);
    // A browser token is refused as one (403, as on the key's other routes); a forged one,
    // as a wrong credential.
    const token = (await (await mint(key)).json<Minted>()).token;
    expect((await mint(token)).status).toBe(403);
    const [head, claims] = token.split(".");
    expect((await mint(`${head}.${claims}.${"A".repeat(43)}`)).status).toBe(401);
    // A blocked or revoked key is told so, as on every other route.
    await exports.default.fetch(`http://edge.test/admin/keys/${id}/block`, {
      method: "POST",
      headers: ADMIN,
    });
    const blocked = await mint(key);
    expect(blocked.status).toBe(403);
    expect((await blocked.json<{ error: unknown }>()).error).toMatchObject({ code: "key_blocked" });
    await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      method: "DELETE",
      headers: ADMIN,
    });
    const revoked = await mint(key);
    expect(revoked.status).toBe(401);
    expect((await revoked.json<{ error: unknown }>()).error).toMatchObject({
      code: "invalid_api_key",
      message: expect.stringContaining("revoked"),
    });
  });
});

describe("browser token verification", () => {
  const base = {
    keyId: "abcdefghijklmnop",
    secretGeneration: 1,
    user: null,
    limits: SCOPE,
    models: null,
    origins: ["https://app.example"],
    budgets: [],
    ttlSeconds: 60,
  };

  it("accepts a token until it expires, then refuses it", async () => {
    const now = Date.now();
    const { token } = await mintBrowserToken(env, { ...base, now });
    expect(await verifyBrowserToken(env, token, now + 59_000, edge.browserTokens)).not.toBeNull();
    expect(await verifyBrowserToken(env, token, now + 61_000, edge.browserTokens)).toBeNull();
  });

  it("refuses a token that is not valid yet", async () => {
    const now = Date.now();
    const { token } = await mintBrowserToken(env, { ...base, now: now + 120_000 });
    expect(await verifyBrowserToken(env, token, now, edge.browserTokens)).toBeNull();
  });

  it("refuses a forged signature, another signing secret and a tampered payload", async () => {
    const now = Date.now();
    const { token } = await mintBrowserToken(env, { ...base, now });
    const [header, payload, signature] = token.split(".");
    const flipped = (signature?.[0] === "A" ? "B" : "A") + (signature ?? "").slice(1);
    expect(
      await verifyBrowserToken(env, `${header}.${payload}.${flipped}`, now, edge.browserTokens),
    ).toBeNull();
    const other = await mintBrowserToken({ TOKEN_SIGNING_SECRET: "other" }, { ...base, now });
    expect(await verifyBrowserToken(env, other.token, now, edge.browserTokens)).toBeNull();
    const claims = JSON.parse(atob((payload ?? "").replaceAll("-", "+").replaceAll("_", "/")));
    const widened = { ...claims, lim: { rpm: 1e9, tpm: 1e9, concurrency: 1e9 } };
    const wider = btoa(JSON.stringify(widened))
      .replaceAll("+", "-")
      .replaceAll("/", "_")
      .replace(/=+$/, "");
    expect(
      await verifyBrowserToken(env, `${header}.${wider}.${signature}`, now, edge.browserTokens),
    ).toBeNull();
    expect(await verifyBrowserToken(env, "not-a-jwt", now, edge.browserTokens)).toBeNull();
  });

  it("refuses a token for another audience, one without an expiry or without its secret", async () => {
    const now = Math.floor(Date.now() / 1_000);
    const secret = hex(await deriveSecret(env, "warmgate/browser-token/v1"));
    const claims = {
      iss: "warmgate",
      aud: "warmgate",
      sub: newKeyId(),
      jti: "0123456789abcdef",
      iat: now,
      nbf: now,
      exp: now + 60,
      gen: 1,
      lim: SCOPE,
      mdl: null,
      org: [],
    };
    // The same secret signs every one, so only the claims decide.
    const verified = async (payload: Parameters<typeof sign>[0]) =>
      verifyBrowserToken(env, await sign(payload, secret, "HS256"), Date.now(), edge.browserTokens);
    expect(await verified(claims)).not.toBeNull();
    expect(await verified({ ...claims, aud: "someone-else" })).toBeNull();
    const { exp: _exp, ...noExpiry } = claims;
    expect(await verified(noExpiry)).toBeNull();
    expect(await verified({ ...claims, exp: now + 7_200 })).toBeNull();
    const { gen: _gen, ...noSecret } = claims;
    expect(await verified(noSecret)).toBeNull();
  });
});

describe("browser tokens on the request path", () => {
  it("enforces per-end-user limits inside the key", async () => {
    const { key } = await createKey({
      name: "per-user",
      allowed_origins: ["https://shop.example"],
    });
    const tokenFor = async (user: string) =>
      (await (await mint(key, { user, limits: { concurrency: 1 } })).json<Minted>()).token;
    const now = Date.now();
    const admit = async (token: string, requestId: string) => {
      const auth = await authenticateBearer(env, `Bearer ${token}`, {
        now,
        origin: "https://shop.example",
        apiKeys: edge.apiKeys,
        browserTokens: edge.browserTokens,
      });
      if (!auth.ok) throw new Error("token refused");
      return admitRequest(env, edge.settlements, auth, {
        requestId,
        model: "m",
        promptTokens: 1,
        maxTokens: 1,
        origin: "https://shop.example",
      });
    };
    const alice = await tokenFor("alice");
    expect((await admit(alice, "a1")).ok).toBe(true);
    expect(await admit(alice, "a2")).toMatchObject({ limit: "concurrency", scope: "end_user" });
    // A second token for the same user shares the user's limits.
    expect(await admit(await tokenFor("alice"), "a3")).toMatchObject({ scope: "end_user" });
    expect((await admit(await tokenFor("bob"), "b1")).ok).toBe(true);
  });

  it("refuses a token used from an origin its key does not allow", async () => {
    const { key } = await createKey({ name: "origin", allowed_origins: ["https://shop.example"] });
    const { token } = await (await mint(key)).json<Minted>();
    const auth = await authenticateBearer(env, `Bearer ${token}`, {
      now: Date.now(),
      origin: "https://evil.example",
      apiKeys: edge.apiKeys,
      browserTokens: edge.browserTokens,
    });
    expect(auth).toMatchObject({ ok: false, error: { status: 403, code: "origin_not_allowed" } });
  });
});

function preflight(origin: string) {
  return exports.default.fetch("http://edge.test/v1/chat/completions", {
    method: "OPTIONS",
    headers: {
      origin,
      "access-control-request-method": "POST",
      "access-control-request-headers": "authorization, content-type, x-stainless-os",
    },
  });
}

describe("CORS preflight", () => {
  it("allows an origin that an active key allows", async () => {
    await createKey({ name: "cors", allowed_origins: ["https://cors-ok.example"] });
    const res = await preflight("https://cors-ok.example");
    expect(res.status).toBe(204);
    expect(res.headers.get("access-control-allow-origin")).toBe("https://cors-ok.example");
    expect(res.headers.get("access-control-allow-methods")).toContain("POST");
    expect(res.headers.get("access-control-allow-headers")).toBe(
      "authorization, content-type, x-stainless-os",
    );
    expect(res.headers.get("vary")).toContain("Origin");
  });

  it("refuses an origin no key allows, with no CORS headers", async () => {
    const res = await preflight("https://cors-refused.example");
    expect(res.status).toBe(403);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
    expect(res.headers.get("access-control-allow-methods")).toBeNull();
  });

  it("refuses an origin whose only key is revoked", async () => {
    const { id } = await createKey({
      name: "cors-revoked",
      allowed_origins: ["https://cors-gone.example"],
    });
    await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      method: "DELETE",
      headers: ADMIN,
    });
    const res = await preflight("https://cors-gone.example");
    expect(res.status).toBe(403);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
  });
});

describe("a key's own business", () => {
  it("is refused to its browser tokens with 403 permission_denied: usage, files, batches and tokens", async () => {
    const { key } = await createKey({ name: "web-batches" });
    const { token } = await (await mint(key, { user: "mallory" })).json<Minted>();
    const form = new FormData();
    form.set("purpose", "batch");
    form.set("file", new File(['{"custom_id":"a"}\n'], "in.jsonl"));
    const calls: [string, string, RequestInit?][] = [
      ["GET", "/v1/usage"],
      ["GET", "/v1/usage/requests/req_0123456789abcdef0123456789abcdef"],
      ["GET", "/v1/files"],
      ["POST", "/v1/files", { body: form }],
      ["GET", "/v1/files/file-0123"],
      ["GET", "/v1/files/file-0123/content"],
      ["DELETE", "/v1/files/file-0123"],
      ["GET", "/v1/batches"],
      ["POST", "/v1/batches", { body: JSON.stringify({ input_file_id: "file-0123" }) }],
      ["GET", "/v1/batches/batch_0123"],
      ["POST", "/v1/batches/batch_0123/cancel"],
      ["POST", "/v1/tokens", { body: JSON.stringify({ user: "eve" }) }],
    ];
    for (const [method, path, init] of calls) {
      const res = await exports.default.fetch(`http://edge.test${path}`, {
        method,
        headers: { authorization: `Bearer ${token}` },
        ...init,
      });
      expect([method, path, res.status]).toEqual([method, path, 403]);
      expect((await res.json<{ error: { code: string; type: string } }>()).error).toMatchObject({
        type: "permission_error",
        code: "permission_denied",
      });
    }
    // The key itself is served.
    const own = await exports.default.fetch("http://edge.test/v1/files", {
      headers: { authorization: `Bearer ${key}` },
    });
    expect(own.status).toBe(200);
  });
});
