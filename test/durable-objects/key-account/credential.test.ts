import { describe, expect, it } from "vitest";
import {
  checkCredential,
  previousSecretValidUntil,
} from "../../../durable-objects/key-account/credential.ts";
import type { SecretRow } from "../../../durable-objects/key-account/schema.ts";

const CURRENT: SecretRow = {
  secret_hash: "b".repeat(64),
  generation: 2,
  created_at: 1_000,
  valid_until: null,
};
// Rotated out at 1_000 with a grace until 5_000.
const PREVIOUS: SecretRow = {
  secret_hash: "a".repeat(64),
  generation: 1,
  created_at: 0,
  valid_until: 5_000,
};
const SECRETS = [PREVIOUS, CURRENT];

// A browser token minted with the secret of this generation.
function minted(secretGeneration: number) {
  return { kind: "browser" as const, secretGeneration };
}

describe("credential check", () => {
  it("accepts the current secret and a rotated-out one until its grace ends", () => {
    const current = { kind: "key" as const, secretHash: CURRENT.secret_hash };
    const previous = { kind: "key" as const, secretHash: PREVIOUS.secret_hash };
    expect(checkCredential(SECRETS, current, 9_000)).toEqual({ ok: true, secretGeneration: 2 });
    expect(checkCredential(SECRETS, previous, 4_999)).toEqual({ ok: true, secretGeneration: 1 });
    expect(checkCredential(SECRETS, previous, 5_000)).toEqual({
      ok: false,
      code: "invalid_api_key",
      reason: "bad_secret",
    });
  });

  it("refuses a secret the key never had", () => {
    const unknown = { kind: "key" as const, secretHash: "c".repeat(64) };
    expect(checkCredential(SECRETS, unknown, 0)).toMatchObject({ ok: false, reason: "bad_secret" });
  });

  it("ends a browser token with the secret that minted it, to the millisecond", () => {
    expect(checkCredential(SECRETS, minted(1), 4_999)).toEqual({ ok: true, secretGeneration: 1 });
    expect(checkCredential(SECRETS, minted(1), 5_000)).toMatchObject({ reason: "rotated" });
    expect(checkCredential(SECRETS, minted(2), 9_000)).toEqual({ ok: true, secretGeneration: 2 });
    expect(checkCredential(SECRETS, minted(3), 0)).toMatchObject({ reason: "rotated" });
  });

  it("reports the previous secret's grace only while it runs", () => {
    expect(previousSecretValidUntil(SECRETS, 4_999)).toBe(5_000);
    expect(previousSecretValidUntil(SECRETS, 5_000)).toBeNull();
    expect(previousSecretValidUntil([CURRENT], 0)).toBeNull();
  });
});
