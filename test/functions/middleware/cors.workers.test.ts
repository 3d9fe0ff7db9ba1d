import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";

const PAGE = "https://refusals.example";

async function mint(key: string, user = "alice"): Promise<string> {
  const res = await exports.default.fetch("http://edge.test/v1/tokens", {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ user }),
  });
  expect(res.status).toBe(200);
  return (await res.json<{ token: string }>()).token;
}

function fromPage(bearer: string, overrides: Record<string, unknown> = {}) {
  return exports.default.fetch(
    edgeRequest("/v1/chat/completions", {
      body: chatBody({ max_tokens: 2, ...overrides }),
      headers: { authorization: `Bearer ${bearer}`, origin: PAGE },
      region: "eu",
    }),
  );
}

function expectReadable(res: Response): void {
  expect(res.headers.get("access-control-allow-origin")).toBe(PAGE);
  const exposed = res.headers.get("access-control-expose-headers") ?? "";
  for (const name of [
    "x-request-id",
    "x-ratelimit-remaining-requests",
    "retry-after",
    "retry-after-ms",
    "x-warmgate-region",
    "x-warmgate-origin",
    "x-warmgate-cost-usd",
  ]) {
    expect(exposed).toContain(name);
  }
  // Every header of the edge's own the answer carries, whichever it is.
  const own = [...res.headers.keys()].filter((name) => /^x-(warmgate|ratelimit)-/.test(name));
  expect(own.filter((name) => !exposed.split(", ").includes(name))).toEqual([]);
}

async function settledRecord(key: string, requestId: string) {
  for (let i = 0; i < 50; i++) {
    const res = await exports.default.fetch(
      edgeRequest(`/v1/usage/requests/${requestId}`, {
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    if (res.status === 200) {
      const record = await res.json<{ status: string; user: string | null }>();
      if (record.status !== "open") return record;
    } else {
      await res.arrayBuffer();
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`request ${requestId} was never settled`);
}

describe("a page reads every refusal", () => {
  it("gets CORS headers on a 401 for a tampered or forged token", async () => {
    const { key } = await createKey({ name: "page", allowed_origins: [PAGE] });
    const token = await mint(key);
    const tampered = `${token.slice(0, -4)}AAAA`;
    for (const bearer of [tampered, "a.b.c"]) {
      const res = await fromPage(bearer);
      expect(res.status).toBe(401);
      expectReadable(res);
      expect((await res.json<ErrorBody>()).error.code).toBe("invalid_api_key");
    }
  });

  it("gets CORS headers on a 401 for a revoked key's token", async () => {
    const { id, key } = await createKey({ name: "page-revoked", allowed_origins: [PAGE] });
    const token = await mint(key);
    await createKey({ name: "page-other", allowed_origins: [PAGE] });
    await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      method: "DELETE",
      headers: ADMIN,
    });
    const res = await fromPage(token);
    expect(res.status).toBe(401);
    expectReadable(res);
    await res.arrayBuffer();
  });

  it("gets CORS headers on a 429 and on a 400", async () => {
    const { key } = await createKey({
      name: "page-limited",
      allowed_origins: [PAGE],
      limits: { rpm: 1 },
    });
    const token = await mint(key);
    const first = await fromPage(token);
    expect(first.status).toBe(200);
    expectReadable(first);
    await first.arrayBuffer();
    const limited = await fromPage(token);
    expect(limited.status).toBe(429);
    expectReadable(limited);
    await limited.arrayBuffer();
    const invalid = await fromPage(token, { temperature: 9 });
    expect(invalid.status).toBe(400);
    expectReadable(invalid);
    await invalid.arrayBuffer();
  });
});

describe("browser tokens and key rotation", () => {
  it("stops a token at a rotation with no grace, even one minted in the same second", async () => {
    const { id, key } = await createKey({ name: "page-rotate", allowed_origins: [PAGE] });
    // Early in a second, so minting and rotating both fall in it (JWT times are seconds).
    while (Date.now() % 1_000 > 300) await new Promise((resolve) => setTimeout(resolve, 20));
    const second = Math.floor(Date.now() / 1_000);
    const leaked = await mint(key);
    const rotated = await exports.default.fetch(`http://edge.test/admin/keys/${id}/rotate`, {
      method: "POST",
      headers: ADMIN,
      body: JSON.stringify({ grace_seconds: 0 }),
    });
    expect(rotated.status).toBe(200);
    const { key: newKey } = await rotated.json<{ key: string }>();
    expect(Math.floor(Date.now() / 1_000)).toBe(second);
    const old = await fromPage(leaked);
    expect(old.status).toBe(401);
    expect((await old.json<ErrorBody>()).error.message).toMatch(/rotated/);
    const fresh = await fromPage(await mint(newKey));
    expect(fresh.status).toBe(200);
    await fresh.arrayBuffer();
  });

  it("keeps tokens minted before a rotation during its grace period", async () => {
    const { id, key } = await createKey({ name: "page-grace", allowed_origins: [PAGE] });
    const before = await mint(key);
    const rotated = await exports.default.fetch(`http://edge.test/admin/keys/${id}/rotate`, {
      method: "POST",
      headers: ADMIN,
      body: JSON.stringify({ grace_seconds: 600 }),
    });
    expect(rotated.status).toBe(200);
    await rotated.arrayBuffer();
    const res = await fromPage(before);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
  });
});

describe("the token's end user in usage", () => {
  it("records the token's user, not the body's, and /v1/usage?user= filters by it", async () => {
    const { key } = await createKey({ name: "page-users", allowed_origins: [PAGE] });
    const alice = await mint(key, "alice");
    const bob = await mint(key, "bob");
    const spoofed = await fromPage(alice, { user: "bob" });
    expect(spoofed.status).toBe(200);
    await spoofed.arrayBuffer();
    const record = await settledRecord(key, spoofed.headers.get("x-request-id") ?? "");
    expect(record.user).toBe("alice");
    for (const token of [bob, bob]) {
      const res = await fromPage(token);
      expect(res.status).toBe(200);
      await settledRecord(key, res.headers.get("x-request-id") ?? "");
    }
    const usage = async (query: string) => {
      const res = await exports.default.fetch(
        edgeRequest(`/v1/usage${query}`, { headers: { authorization: `Bearer ${key}` } }),
      );
      expect(res.status).toBe(200);
      return res.json<{ user: string | null; total: { requests: number } }>();
    };
    expect((await usage("?user=alice")).total.requests).toBe(1);
    expect(await usage("?user=bob")).toMatchObject({ user: "bob", total: { requests: 2 } });
    expect((await usage("?user=carol")).total.requests).toBe(0);
    expect((await usage("")).total.requests).toBe(3);
  });
});
