import { describe, expect, it } from "vitest";
import { KeyRequests } from "../../../functions/accounts/key-requests.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

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
    requests.asking("k1");
    const endK1 = requests.started("k1");
    const endK2 = requests.started("k2");
    const waiting = requests.whenOneEnds("k1", 5_000, Date.now());
    endK2();
    expect(requests.count("k2")).toBe(0);
    endK1();
    expect(await waiting).not.toBeNull();
  });

  it("wakes one waiter for each request that ends", async () => {
    const requests = new KeyRequests();
    requests.asking("k1");
    const ends = [requests.started("k1"), requests.started("k1"), requests.started("k1")];
    const since = Date.now();
    const waiting = [0, 1, 2].map(() => requests.whenOneEnds("k1", 200, since));
    ends[0]?.();
    ends[1]?.();
    const woken = await Promise.all(waiting);
    expect(woken.filter((at) => at !== null)).toHaveLength(2);
  });

  it("counts an end heard while the refused call was under way, the last one of its key", async () => {
    const requests = new KeyRequests();
    const end = requests.started("k1");
    requests.asking("k1");
    const askedAt = Date.now();
    // The client left during the call that refused the next request: nothing runs now.
    end();
    expect(requests.count("k1")).toBe(0);
    expect(await requests.whenOneEnds("k1", 200, askedAt)).not.toBeNull();
    // Taken once.
    expect(await requests.whenOneEnds("k1", 200, askedAt)).toBeNull();
  });

  it("takes no end from before the refused call, and passes one on that a waiter gave back", async () => {
    const requests = new KeyRequests();
    const end = requests.started("k1");
    requests.started("k1");
    requests.asking("k1");
    const before = Date.now();
    end();
    await sleep(5);
    expect(await requests.whenOneEnds("k1", 20, Date.now())).toBeNull();
    // A waiter refused by its own end user's limit gives the end back for the next.
    const taken = await requests.whenOneEnds("k1", 20, before);
    expect(taken).not.toBeNull();
    requests.giveBack("k1", taken ?? 0);
    expect(await requests.whenOneEnds("k1", 20, before)).toBe(taken);
  });

  it("keeps no end while none of the key asks for a slot", async () => {
    const requests = new KeyRequests();
    const askedAt = Date.now();
    const end = requests.started("k1");
    requests.started("k1");
    end();
    expect(await requests.whenOneEnds("k1", 20, askedAt)).toBeNull();
  });

  it("does not wait when none of the key runs, and gives up after its time", async () => {
    const requests = new KeyRequests();
    expect(await requests.whenOneEnds("k1", 5_000, Date.now())).toBeNull();
    requests.started("k1");
    expect(await requests.whenOneEnds("k1", 10, Date.now())).toBeNull();
  });
});
