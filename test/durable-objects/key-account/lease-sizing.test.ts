import { describe, expect, it } from "vitest";
import {
  LEASE_SHARE,
  MIN_LEASE_REQUESTS,
  leaseTarget,
  topUp,
} from "../../../durable-objects/key-account/leases/sizing.ts";

const NONE = { requests: 0, tokens: 0, picos: 0n, slots: 0 };

describe("the size of a lease", () => {
  it("starts small: a few requests of the isolate's size", () => {
    const target = leaseTarget({ requests: 1, tokens: 100, picos: 10n, inFlight: 1 });
    expect(target).toEqual({ requests: MIN_LEASE_REQUESTS, tokens: 400, picos: 40n, slots: 2 });
  });

  it("takes at most a quarter of the key's headroom", () => {
    const target = leaseTarget({ requests: 1_000, tokens: 100_000, picos: 1_000n, inFlight: 8 });
    const headroom = { requests: 400, tokens: 1_000_000, picos: 1_000_000n, slots: 64 };
    const add = topUp(target, NONE, headroom);
    expect(add?.requests).toBe(400 / LEASE_SHARE);
    expect(add?.slots).toBe(16);
  });

  it("is none when a quarter of the headroom cannot hold a few of its requests", () => {
    const target = leaseTarget({ requests: 1, tokens: 100, picos: 0n, inFlight: 1 });
    const small = { requests: 12, tokens: 1_000_000, picos: null, slots: 10 };
    expect(topUp(target, NONE, small)).toBeNull();
  });

  it("never reserves more money than a quarter of the budget's room", () => {
    const target = leaseTarget({ requests: 10, tokens: 1_000, picos: 1_000_000n, inFlight: 1 });
    const room = { requests: 1_000, tokens: 1_000_000, picos: 4_000_000n, slots: 8 };
    expect(topUp(target, NONE, room)?.picos).toBe(1_000_000n);
  });
});
