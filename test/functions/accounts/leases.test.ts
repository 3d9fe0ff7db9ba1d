import { describe, expect, it } from "vitest";
import { hourOf } from "../../../contracts/budget-periods.ts";
import { AccountLeases, MAX_END_USER_LEASES } from "../../../functions/accounts/leases.ts";
import type { LeaseGrant } from "../../../durable-objects/key-account/leases/types.ts";

const NOW = Date.UTC(2026, 5, 1, 12);
const OPTIONS = { windowMs: 1_000, models: [], now: NOW };

function grant(leaseId: string): LeaseGrant {
  const bucket = { limit: 100, remaining: 90, resetMs: 0 };
  return {
    leaseId,
    granted: { requests: 10, tokens: 1_000, picos: null, ids: 10 },
    slots: 2,
    admitForMs: 1_000,
    hour: hourOf(NOW),
    models: [],
    key: {
      models: null,
      allowedOrigins: [],
      expiresAt: null,
      tier: "standard",
      allowRegionOverride: false,
      budgeted: false,
      teamId: null,
      limitedModels: [],
    },
    rateLimit: { requests: bucket, tokens: bucket },
  };
}

function hold(leases: AccountLeases, keyId: string, endUser: string | null, leaseId: string) {
  const scope = endUser === null ? null : { endUser, subject: null };
  const ask = leases.ask(keyId, scope, "renew", OPTIONS);
  if (ask === null) throw new Error("no ask");
  leases.answered(keyId, "hash", ask, { lease: grant(leaseId), dropped: false }, NOW);
}

describe("AccountLeases.leasedKeys", () => {
  it("counts each key with a lease that admits now once, its end users' leases with it", () => {
    const leases = new AccountLeases();
    hold(leases, "k1", null, "0000000000000001");
    hold(leases, "k2", null, "0000000000000002");
    hold(leases, "k2", "alice", "0000000000000003");
    hold(leases, "k3", "bob", "0000000000000004");
    expect(leases.leasedKeys(NOW)).toBe(3);
    // Past their window they admit nothing: no key counts.
    expect(leases.leasedKeys(NOW + 1_000)).toBe(0);
  });

  it("holds a key's own lease and each end user's apart", () => {
    const leases = new AccountLeases();
    hold(leases, "k1", null, "0000000000000001");
    hold(leases, "k1", "alice", "0000000000000002");
    expect(leases.held("k1")?.leaseId).toBe("0000000000000001");
    expect(leases.held("k1", { endUser: "alice", subject: null })?.leaseId).toBe(
      "0000000000000002",
    );
    expect(leases.held("k1", { endUser: "bob", subject: null })).toBeNull();
  });
});

const user = (i: number) => ({ endUser: `user-${i}`, subject: null });

describe("AccountLeases.ask", () => {
  it("asks for no more end users' leases of a key than it may hold, counting asks not answered yet", () => {
    const leases = new AccountLeases();
    // Their first requests arrive at once: no answer has come back yet.
    const asks = Array.from({ length: MAX_END_USER_LEASES + 4 }, (_, i) =>
      leases.ask("key_a", user(i), "trim", OPTIONS),
    );
    expect(asks.filter((ask) => ask !== null)).toHaveLength(MAX_END_USER_LEASES);
    // One answered without a lease: another end user may ask in its place.
    const first = asks[0];
    if (first === null || first === undefined) throw new Error("no ask");
    leases.answered("key_a", "hash", first, { lease: null, dropped: false }, NOW);
    expect(leases.ask("key_a", user(100), "trim", OPTIONS)).not.toBeNull();
    expect(leases.ask("key_a", user(101), "trim", OPTIONS)).toBeNull();
  });
});
