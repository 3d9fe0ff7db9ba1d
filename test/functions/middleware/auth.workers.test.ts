import {
  createExecutionContext,
  listDurableObjectIds,
  runInDurableObject,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import app from "../../../functions/index.ts";
import { mintApiKey, newKeyId } from "../../../functions/accounts/keys.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { settledLedgerRow } from "../../support/key-accounts.workers.ts";

const RATE_LIMIT_HEADERS = [
  "x-ratelimit-limit-requests",
  "x-ratelimit-remaining-requests",
  "x-ratelimit-reset-requests",
  "x-ratelimit-limit-tokens",
  "x-ratelimit-remaining-tokens",
  "x-ratelimit-reset-tokens",
];

const slow = inject("testOrigins").find((origin) => origin.id === "slow-1");
if (slow === undefined) throw new Error("slow-1 is not running");

function account(id: string): DurableObjectStub<KeyAccount> {
  return env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
}

function chat(
  key: string,
  overrides: Record<string, unknown> = {},
  headers: Record<string, string> = {},
) {
  return edgeRequest("/v1/chat/completions", {
    body: chatBody(overrides),
    headers: { authorization: `Bearer ${key}`, ...headers },
    region: headers["x-warmgate-region"] ?? "eu",
  });
}

/** Runs one request against the edge with another config and waits for its `waitUntil` work. */
async function fetchWithConfig(config: string, request: Request): Promise<Response> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  await response.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return response;
}

async function openCount(keyId: string): Promise<number> {
  return runInDurableObject(account(keyId), (instance: KeyAccount, state) => {
    instance.flush();
    return state.storage.sql
      .exec<{ n: number }>("SELECT COUNT(*) AS n FROM ledger WHERE state = 'open'")
      .one().n;
  });
}

describe("keys on the completion routes", () => {
  it("puts OpenAI's six rate-limit headers on admitted responses, streamed or not", async () => {
    const { key } = await createKey({ name: "headers", limits: { rpm: 50, tpm: 100_000 } });
    const first = await exports.default.fetch(chat(key));
    expect(first.status).toBe(200);
    await first.arrayBuffer();
    for (const name of RATE_LIMIT_HEADERS) expect(first.headers.get(name)).not.toBeNull();
    expect(first.headers.get("x-ratelimit-limit-requests")).toBe("50");
    expect(first.headers.get("x-ratelimit-remaining-requests")).toBe("49");
    expect(first.headers.get("x-ratelimit-limit-tokens")).toBe("100000");

    const streamed = await exports.default.fetch(chat(key, { stream: true }));
    expect(streamed.headers.get("content-type")).toMatch(/^text\/event-stream/);
    expect(streamed.headers.get("x-ratelimit-remaining-requests")).toBe("48");
    await streamed.arrayBuffer();
  });

  it("refuses the request over the per-minute limit with 429, retry-after and the limit headers", async () => {
    const { key } = await createKey({ name: "rpm-1", limits: { rpm: 1 } });
    const first = await exports.default.fetch(chat(key));
    expect(first.status).toBe(200);
    await first.arrayBuffer();
    const second = await exports.default.fetch(chat(key));
    expect(second.status).toBe(429);
    expect(Number(second.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(Number(second.headers.get("retry-after-ms"))).toBeGreaterThan(0);
    expect(second.headers.get("x-ratelimit-remaining-requests")).toBe("0");
    expect(second.headers.get("x-request-id")).toMatch(/^req_/);
    expect((await second.json<ErrorBody>()).error).toMatchObject({
      type: "requests",
      code: "rate_limit_exceeded",
      param: null,
    });
  });

  it("refuses a request larger than the key's tpm with no retry-after, and tells the SDKs not to retry", async () => {
    const { key } = await createKey({ name: "tpm-small", limits: { tpm: 1_000 } });
    const first = await exports.default.fetch(chat(key));
    expect(first.status).toBe(200);
    await first.arrayBuffer();
    const large = await exports.default.fetch(chat(key, { max_tokens: 5_000 }));
    expect(large.status).toBe(429);
    // No wait makes it fit: a retry-after would have the SDKs wait for nothing.
    expect(large.headers.get("retry-after")).toBeNull();
    expect(large.headers.get("retry-after-ms")).toBeNull();
    expect(large.headers.get("x-should-retry")).toBe("false");
    expect(large.headers.get("x-ratelimit-limit-tokens")).toBe("1000");
    const { error } = await large.json<ErrorBody>();
    expect(error).toMatchObject({ type: "tokens", code: "rate_limit_exceeded" });
    expect(error.message).toMatch(/^Request too large/);
  });

  it("refuses a forged key with 401 without calling any Durable Object", async () => {
    const id = newKeyId();
    const { key } = await mintApiKey({ TOKEN_SIGNING_SECRET: "someone-else" }, id);
    const res = await exports.default.fetch(chat(key));
    expect(res.status).toBe(401);
    const body = await res.text();
    expect(body).toContain("invalid_api_key");
    expect(body).not.toContain(key);
    const ids = await listDurableObjectIds(env.KEY_ACCOUNT);
    expect(ids.some((doId) => doId.equals(env.KEY_ACCOUNT.idFromName(id)))).toBe(false);
  });

  it("calls a credential that is neither a key nor a browser token an incorrect API key", async () => {
    for (const credential of ["sk-not-ours", "wrong", "a.b"]) {
      const res = await exports.default.fetch(
        new Request("http://edge.test/v1/models", {
          headers: { authorization: `Bearer ${credential}` },
        }),
      );
      expect(res.status).toBe(401);
      const { error } = await res.json<ErrorBody>();
      expect(error).toEqual({
        message: "Incorrect API key provided.",
        type: "invalid_request_error",
        param: null,
        code: "invalid_api_key",
      });
    }
  });

  it("refuses a revoked key on its very next request, completions and models alike", async () => {
    const { id, key } = await createKey({ name: "revoked" });
    const ok = await exports.default.fetch(chat(key));
    expect(ok.status).toBe(200);
    await ok.arrayBuffer();
    await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      method: "DELETE",
      headers: ADMIN,
    });
    const refused = await exports.default.fetch(chat(key));
    expect(refused.status).toBe(401);
    expect((await refused.json<ErrorBody>()).error.code).toBe("invalid_api_key");
    const models = await exports.default.fetch(
      edgeRequest("/v1/models", { headers: { authorization: `Bearer ${key}` } }),
    );
    expect(models.status).toBe(401);
    expect((await models.json<ErrorBody>()).error.message).toBe("This API key has been revoked.");
  });

  it("lists models without consuming any limit", async () => {
    const { key } = await createKey({ name: "models-free", limits: { rpm: 1 } });
    for (let i = 0; i < 3; i++) {
      const res = await exports.default.fetch(
        edgeRequest("/v1/models", { headers: { authorization: `Bearer ${key}` } }),
      );
      expect(res.status).toBe(200);
      expect(res.headers.get("x-ratelimit-remaining-requests")).toBeNull();
      await res.arrayBuffer();
    }
    const completion = await exports.default.fetch(chat(key));
    expect(completion.status).toBe(200);
    expect(completion.headers.get("x-ratelimit-remaining-requests")).toBe("0");
    await completion.arrayBuffer();
  });

  it("refuses a model outside the key's models with 403 model_not_allowed", async () => {
    const { key } = await createKey({ name: "models", models: ["warmgate-sim-70b"] });
    const res = await exports.default.fetch(chat(key));
    expect(res.status).toBe(403);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      code: "model_not_allowed",
      param: "model",
    });
  });
});

/** A long stream from the slow origin on `key`, its first bytes read: its slot is held. */
async function longStream(key: string) {
  const res = await exports.default.fetch(
    edgeRequest("/v1/chat/completions", {
      body: chatBody({ stream: true, max_tokens: 4000 }),
      headers: { authorization: `Bearer ${key}` },
      region: "slow",
    }),
  );
  expect(res.status).toBe(200);
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  expect((await reader.read()).done).toBe(false);
  return { res, reader };
}

describe("settlement on every ending path", () => {
  it("settles a finished JSON and a finished stream as ok", async () => {
    const { id, key } = await createKey({ name: "ok-paths", limits: { concurrency: 1 } });
    for (const stream of [false, true]) {
      const res = await exports.default.fetch(chat(key, { stream }));
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const row = await settledLedgerRow(id, res.headers.get("x-request-id") ?? "");
      expect(row).toEqual({ state: "settled", outcome: "ok" });
    }
    expect(await openCount(id)).toBe(0);
  });

  it("settles a client cancel as cancelled and frees the slot", async () => {
    const { id, key } = await createKey({ name: "cancel-path", limits: { concurrency: 1 } });
    const { res, reader } = await longStream(key);
    await reader.cancel();
    const row = await settledLedgerRow(id, res.headers.get("x-request-id") ?? "");
    expect(row).toEqual({ state: "settled", outcome: "cancelled" });
    const next = await exports.default.fetch(chat(key));
    expect(next.status).toBe(200);
    await next.arrayBuffer();
  });

  it("admits a request sent while the key's only slot is being given up", async () => {
    // A client cancels a stream and sends its next request at once; the edge hears that it
    // left only at the stream's next write. Here the next request comes first, and the
    // stream is cancelled while it is being refused: it waits for that slot.
    const { key } = await createKey({ name: "cancel-then-next", limits: { concurrency: 1 } });
    const { reader } = await longStream(key);
    const next = exports.default.fetch(chat(key));
    await new Promise((resolve) => setTimeout(resolve, 40));
    await reader.cancel();
    const answered = await next;
    expect(answered.status).toBe(200);
    await answered.arrayBuffer();
  });

  it("still refuses a request over the key's concurrency when no slot comes free", async () => {
    const { key } = await createKey({ name: "over-concurrency", limits: { concurrency: 1 } });
    const { reader } = await longStream(key);
    const refused = await exports.default.fetch(chat(key));
    expect(refused.status).toBe(429);
    expect((await refused.json<ErrorBody>()).error.code).toBe("rate_limit_exceeded");
    await reader.cancel();
  });

  it("settles an edge error after admission as error", async () => {
    const { id, key } = await createKey({ name: "edge-error", limits: { concurrency: 1 } });
    const res = await exports.default.fetch(chat(key, {}, { "x-warmgate-region": "nowhere" }));
    expect(res.status).toBe(400);
    for (const name of RATE_LIMIT_HEADERS) expect(res.headers.get(name)).not.toBeNull();
    const row = await settledLedgerRow(id, res.headers.get("x-request-id") ?? "");
    expect(row).toEqual({ state: "settled", outcome: "error" });
  });

  it("settles an unreachable origin as error", async () => {
    const { id, key } = await createKey({ name: "origin-error", limits: { concurrency: 1 } });
    const config = JSON.stringify({
      models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
      regions: [{ id: "eu", origins: [{ id: "gone-auth", url: "http://127.0.0.1:9" }] }],
      default_region: "eu",
    });
    const res = await fetchWithConfig(config, chat(key));
    expect(res.status).toBe(503);
    expect(await settledLedgerRow(id, res.headers.get("x-request-id") ?? "")).toEqual({
      state: "settled",
      outcome: "error",
    });
  });

  it("settles an item the origin timed out as timeout", async () => {
    const { id, key } = await createKey({ name: "timeout-path", limits: { concurrency: 1 } });
    const config = JSON.stringify({
      models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
      regions: [{ id: "slow", origins: [{ id: "slow-timeout", url: slow?.url }] }],
      default_region: "slow",
      limits: { request_timeout_ms: 300 },
    });
    const res = await fetchWithConfig(
      config,
      chat(key, { stream: true, max_tokens: 4000 }, { "x-warmgate-region": "slow" }),
    );
    expect(res.status).toBe(200);
    expect(await settledLedgerRow(id, res.headers.get("x-request-id") ?? "")).toEqual({
      state: "settled",
      outcome: "timeout",
    });
    expect(await openCount(id)).toBe(0);
  });
});

async function tokenFor(key: string): Promise<string> {
  const res = await exports.default.fetch("http://edge.test/v1/tokens", {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ user: "alice" }),
  });
  expect(res.status).toBe(200);
  return (await res.json<{ token: string }>()).token;
}

describe("browser tokens on the completion routes", () => {
  it("answers an allowed origin with CORS headers that expose the rate-limit headers", async () => {
    const { key } = await createKey({ name: "web", allowed_origins: ["https://shop.example"] });
    const token = await tokenFor(key);
    const res = await exports.default.fetch(chat(token, {}, { origin: "https://shop.example" }));
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBe("https://shop.example");
    expect(res.headers.get("access-control-expose-headers")).toContain(
      "x-ratelimit-remaining-requests",
    );
    expect(res.headers.get("x-ratelimit-remaining-requests")).not.toBeNull();
    await res.arrayBuffer();
  });

  it("refuses another origin with 403 and no CORS allowance", async () => {
    const { key } = await createKey({ name: "web-2", allowed_origins: ["https://shop.example"] });
    const token = await tokenFor(key);
    const res = await exports.default.fetch(chat(token, {}, { origin: "https://evil.example" }));
    expect(res.status).toBe(403);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
    expect((await res.json<ErrorBody>()).error.code).toBe("origin_not_allowed");
  });

  it("refuses a token whose key no longer allows the origin", async () => {
    const { id, key } = await createKey({
      name: "web-3",
      allowed_origins: ["https://moved-shop.example"],
    });
    const token = await tokenFor(key);
    await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      method: "PATCH",
      headers: ADMIN,
      body: JSON.stringify({ allowed_origins: ["https://new-shop.example"] }),
    });
    // No active key allows the old origin any more: the page may not even read the refusal.
    const res = await exports.default.fetch(
      chat(token, {}, { origin: "https://moved-shop.example" }),
    );
    expect(res.status).toBe(403);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
  });
});
