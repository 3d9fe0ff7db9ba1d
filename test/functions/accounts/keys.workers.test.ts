import { listDurableObjectIds } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { authenticateBearer, refusalError } from "../../../functions/accounts/account-client.ts";
import { base32, constantTimeEqual, sha256Hex } from "../../../contracts/hashing.ts";
import {
  bearerToken,
  mintApiKey,
  newKeyId,
  parseApiKey,
} from "../../../functions/accounts/keys.ts";
import { EdgeState } from "../../../functions/edge-state.ts";

// This file's own isolate state (keys checked, settlements queued).
const edge = new EdgeState(env);

describe("API key format", () => {
  it("mints wg_<id>_<secret><check> and parses it back to its id and hash", async () => {
    const id = newKeyId();
    const { key, secretHash } = await mintApiKey(env, id);
    expect(key).toMatch(/^wg_[a-z2-7]{16}_[a-z2-7]{34}$/);
    expect(key.startsWith(`wg_${id}_`)).toBe(true);
    expect(secretHash).toBe(await sha256Hex(key));
    expect(await parseApiKey(env, key, edge.apiKeys)).toEqual({ keyId: id, secretHash });
  });

  it("rejects malformed keys", async () => {
    const { key } = await mintApiKey(env, newKeyId());
    for (const bad of [
      "",
      "wg_",
      "sk-abc",
      key.slice(0, -1),
      `${key}a`,
      key.toUpperCase(),
      ` ${key}`,
    ]) {
      expect(await parseApiKey(env, bad, edge.apiKeys)).toBeNull();
    }
  });

  it("rejects a forged key whose check part does not match", async () => {
    const { key } = await mintApiKey(env, newKeyId());
    const last = key.at(-1) === "a" ? "b" : "a";
    expect(await parseApiKey(env, key.slice(0, -1) + last, edge.apiKeys)).toBeNull();
    // Same shape, another secret: the check no longer matches.
    const cut = key.lastIndexOf("_") + 1;
    const otherSecret = key.slice(0, cut) + (key[cut] === "a" ? "b" : "a") + key.slice(cut + 1);
    expect(await parseApiKey(env, otherSecret, edge.apiKeys)).toBeNull();
  });

  it("rejects a key minted under another signing secret", async () => {
    const { key } = await mintApiKey({ TOKEN_SIGNING_SECRET: "another-secret" }, newKeyId());
    expect(await parseApiKey(env, key, edge.apiKeys)).toBeNull();
  });

  it("answers a key it has checked before the same way, under its own signing secret only", async () => {
    const other = { TOKEN_SIGNING_SECRET: "yet-another-secret" };
    const id = newKeyId();
    const { key, secretHash } = await mintApiKey(other, id);
    const last = key.at(-1) === "a" ? "b" : "a";
    const forged = key.slice(0, -1) + last;
    for (let round = 0; round < 2; round++) {
      expect(await parseApiKey(other, key, edge.apiKeys)).toEqual({ keyId: id, secretHash });
      expect(await parseApiKey(other, forged, edge.apiKeys)).toBeNull();
      // Remembered under `other`, the same key still fails the edge's own secret.
      expect(await parseApiKey(env, key, edge.apiKeys)).toBeNull();
    }
  });

  it("encodes base32 as RFC 4648 in lower case", () => {
    expect(base32(new TextEncoder().encode("foobar"))).toBe("mzxw6ytboi");
  });

  it("compares strings fully whatever their lengths", () => {
    expect(constantTimeEqual("abc", "abc")).toBe(true);
    expect(constantTimeEqual("abc", "abd")).toBe(false);
    expect(constantTimeEqual("abc", "abcd")).toBe(false);
    expect(constantTimeEqual("", "")).toBe(true);
  });

  it("reads a bearer credential from an Authorization header", () => {
    expect(bearerToken("Bearer abc")).toBe("abc");
    expect(bearerToken("bearer   abc ")).toBe("abc");
    expect(bearerToken("Basic abc")).toBeNull();
    expect(bearerToken(undefined)).toBeNull();
  });
});

describe("authenticateBearer", () => {
  it("accepts a well-formed key without calling its Durable Object", async () => {
    const id = newKeyId();
    const { key, secretHash } = await mintApiKey(env, id);
    const auth = await authenticateBearer(env, `Bearer ${key}`, {
      now: Date.now(),
      apiKeys: edge.apiKeys,
      browserTokens: edge.browserTokens,
    });
    expect(auth).toEqual({ ok: true, kind: "key", keyId: id, secretHash });
    const ids = await listDurableObjectIds(env.KEY_ACCOUNT);
    expect(ids.some((doId) => doId.equals(env.KEY_ACCOUNT.idFromName(id)))).toBe(false);
  });

  it("refuses missing, malformed and forged credentials with invalid_api_key, never echoing them", async () => {
    const { key } = await mintApiKey(env, newKeyId());
    const forged = key.slice(0, -1) + (key.at(-1) === "a" ? "b" : "a");
    for (const header of [undefined, "Bearer wg_nope", `Bearer ${forged}`, "Bearer e30.e30.e30"]) {
      const auth = await authenticateBearer(env, header, {
        now: Date.now(),
        apiKeys: edge.apiKeys,
        browserTokens: edge.browserTokens,
      });
      expect(auth).toMatchObject({ ok: false, error: { status: 401, code: "invalid_api_key" } });
      expect(JSON.stringify(auth)).not.toContain(forged);
      expect(JSON.stringify(auth)).not.toContain("wg_");
    }
  });
});

describe("refusalError", () => {
  it("turns a rate-limit refusal into a 429 with retry-after and rate-limit headers", () => {
    const error = refusalError(
      {
        ok: false,
        code: "rate_limit_exceeded",
        limit: "requests",
        scope: "key",
        limitValue: 10,
        requested: 1,
        retryAfterMs: 6_000,
        tooLarge: false,
        rateLimit: {
          requests: { limit: 10, remaining: 0, resetMs: 6_000 },
          tokens: { limit: 1_000, remaining: 900, resetMs: 6_000 },
        },
      },
      "abcdefghijklmnop",
    );
    expect(error).toMatchObject({ status: 429, code: "rate_limit_exceeded", type: "requests" });
    expect(error.message).toContain("Please try again in 6s");
    expect(error.headers).toMatchObject({
      "retry-after": "6",
      "retry-after-ms": "6000",
      "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-requests": "6s",
    });
  });

  it("says that a team's keys hold its budget for requests in flight, and to retry soon", () => {
    const error = refusalError(
      {
        ok: false,
        code: "insufficient_quota",
        budget: "1d",
        scope: "team",
        teamId: "team_abcdefghijklmnop",
        limitPicos: 2_000_000_000n,
        spentPicos: 1_000_000_000n,
        reservedPicos: 800_000_000n,
        requestedPicos: 400_000_000n,
        retryAfterMs: 1_000,
        resetsAt: Date.now() + 3_600_000,
        rateLimit: {
          requests: { limit: 10, remaining: 9, resetMs: 0 },
          tokens: { limit: 1_000, remaining: 900, resetMs: 0 },
        },
      },
      "abcdefghijklmnop",
    );
    expect(error).toMatchObject({ status: 429, code: "insufficient_quota" });
    expect(error.message).toContain("team team_abcdefghijklmnop of key abcdefghijklmnop");
    expect(error.message).toContain("held by its keys $0.000800");
    expect(error.message).toContain("Its keys' requests in flight hold part of it");
    expect(error.headers).toMatchObject({ "retry-after": "1" });
  });

  it("turns a revoked key into a 401 invalid_api_key", () => {
    expect(
      refusalError({ ok: false, code: "invalid_api_key", reason: "revoked" }, "abcdefghijklmnop"),
    ).toMatchObject({ status: 401, code: "invalid_api_key" });
  });
});
