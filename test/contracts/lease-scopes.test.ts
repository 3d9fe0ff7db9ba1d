import { describe, expect, it } from "vitest";
import { holderCredential, leaseHolder, leaseScopeKey } from "../../contracts/lease-scopes.ts";

const LIMITS = { rpm: 10, tpm: 1_000, concurrency: 2 };

describe("lease holders", () => {
  it("name an API key by its hash and a browser token by its secret's generation, both ways", () => {
    const key = { kind: "key", secretHash: "ab12" } as const;
    const token = { kind: "browser", secretGeneration: 3 } as const;
    expect(leaseHolder(token)).toBe("gen:3");
    expect(holderCredential(leaseHolder(key))).toEqual(key);
    expect(holderCredential(leaseHolder(token))).toEqual(token);
  });
});

describe("lease scopes", () => {
  it("are the key's own without an end user, and differ by user, token subject and limits", () => {
    const alice = { endUser: "alice", subject: null };
    const token = { endUser: "alice", subject: { id: "user:alice", limits: LIMITS, models: null } };
    const keys = [
      leaseScopeKey(null),
      leaseScopeKey(alice),
      leaseScopeKey({ endUser: "bob", subject: null }),
      leaseScopeKey(token),
      leaseScopeKey({ ...token, subject: { ...token.subject, limits: { ...LIMITS, rpm: 11 } } }),
      leaseScopeKey({ ...token, subject: { ...token.subject, models: ["m"] } }),
    ];
    expect(keys[0]).toBe("");
    expect(new Set(keys).size).toBe(keys.length);
    expect(leaseScopeKey({ ...alice })).toBe(keys[1]);
  });
});
