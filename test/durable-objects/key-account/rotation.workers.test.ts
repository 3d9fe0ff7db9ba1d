import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { AdmitCredential } from "../../../durable-objects/key-account/types.ts";
import { mintApiKey, newKeyId } from "../../../functions/accounts/keys.ts";

const LIMITS = { rpm: 1_000, tpm: 1_000_000, concurrency: 10 };

async function newAccount(now: number) {
  const id = newKeyId();
  const { secretHash } = await mintApiKey(env, id);
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
  await stub.create({
    id,
    name: "rotation",
    secretHash,
    limits: LIMITS,
    allowedOrigins: [],
    models: null,
    tier: "standard",
    expiresAt: null,
    now,
  });
  const admit = (requestId: string, credential: AdmitCredential, at: number) =>
    stub.admit({ requestId, credential, model: "m", promptTokens: 1, maxTokens: 1, now: at });
  const rotate = async (graceMs: number, at: number) => {
    const { secretHash: next } = await mintApiKey(env, id);
    await stub.rotate({ secretHash: next, graceMs, now: at });
    return { kind: "key" as const, secretHash: next };
  };
  return { stub, admit, rotate, key: { kind: "key" as const, secretHash } };
}

function token(secretGeneration: number): AdmitCredential {
  return { kind: "browser", secretGeneration, subject: "user:a", limits: LIMITS, models: null };
}

describe("KeyAccount rotation", () => {
  it("accepts the old secret within the grace period and refuses it after", async () => {
    const t = 10_000_000;
    const { admit, rotate, key: old } = await newAccount(t - 1_000);
    const current = await rotate(60_000, t);
    expect((await admit("a", old, t + 59_999)).ok).toBe(true);
    expect(await admit("b", old, t + 60_000)).toMatchObject({
      code: "invalid_api_key",
      reason: "bad_secret",
    });
    expect((await admit("c", current, t + 60_000)).ok).toBe(true);
  });

  it("names the generation of the secret a key matched, for the tokens it mints", async () => {
    const t = 10_000_000;
    const { stub, rotate, key: old } = await newAccount(t - 1_000);
    const current = await rotate(60_000, t);
    const check = (credential: { kind: "key"; secretHash: string }) =>
      stub.check({ credential, now: t + 1 });
    expect(await check(old)).toMatchObject({ ok: true, secretGeneration: 1 });
    expect(await check(current)).toMatchObject({ ok: true, secretGeneration: 2 });
  });

  it("ends every token of the old secret at a rotation with no grace, in its very millisecond", async () => {
    const t = 10_000_000;
    const { admit, rotate } = await newAccount(t - 1_000);
    expect((await admit("before", token(1), t - 1)).ok).toBe(true);
    await rotate(0, t);
    expect(await admit("at", token(1), t)).toMatchObject({
      code: "invalid_api_key",
      reason: "rotated",
    });
    expect((await admit("new", token(2), t)).ok).toBe(true);
  });

  it("ends a token the old secret minted during the grace period when the grace ends", async () => {
    const t = 10_000_000;
    const { admit, rotate } = await newAccount(t - 1_000);
    await rotate(60_000, t);
    expect((await admit("grace", token(1), t + 59_999)).ok).toBe(true);
    expect(await admit("after", token(1), t + 60_000)).toMatchObject({ reason: "rotated" });
    expect((await admit("new", token(2), t + 60_000)).ok).toBe(true);
  });

  it("refuses a token naming a secret the key never had", async () => {
    const { admit } = await newAccount(Date.now());
    expect(await admit("r", token(2), Date.now())).toMatchObject({ reason: "rotated" });
  });
});
