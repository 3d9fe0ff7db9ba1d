import { describe, expect, it } from "vitest";
import { KeyRequests } from "../../../functions/accounts/key-requests.ts";

describe("a key's requests in flight in the isolate", () => {
  it("counts each until it ends, once", () => {
    const requests = new KeyRequests();
    const end = requests.started("k1");
    requests.started("k1");
    expect(requests.count("k1")).toBe(2);
    end();
    end();
    expect(requests.count("k1")).toBe(1);
    expect(requests.count("k2")).toBe(0);
  });

  it("wakes who waits when one ends, and not for another key", async () => {
    const requests = new KeyRequests();
    const endK1 = requests.started("k1");
    const endK2 = requests.started("k2");
    const waiting = requests.whenOneEnds("k1", 5_000);
    endK2();
    endK1();
    expect(await waiting).toBe(true);
  });

  it("wakes one waiter for each request that ends, and keeps no end for later waiters", async () => {
    const requests = new KeyRequests();
    const ends = [requests.started("k1"), requests.started("k1"), requests.started("k1")];
    const waiting = [0, 1, 2].map(() => requests.whenOneEnds("k1", 200));
    ends[0]?.();
    ends[1]?.();
    const woken = await Promise.all(waiting);
    expect(woken.filter(Boolean)).toHaveLength(2);
    // The third gave up after its time; an end with no waiter wakes nobody later.
    ends[2]?.();
    requests.started("k1");
    expect(await requests.whenOneEnds("k1", 50)).toBe(false);
  });

  it("does not wait when none of the key runs, and gives up after its time", async () => {
    const requests = new KeyRequests();
    expect(await requests.whenOneEnds("k1", 5_000)).toBe(false);
    requests.started("k1");
    expect(await requests.whenOneEnds("k1", 10)).toBe(false);
  });
});
