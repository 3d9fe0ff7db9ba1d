import { describe, expect, it } from "vitest";
import { BatcherMemo } from "../../../functions/delivery/batcher-memo.ts";

// What an isolate learns of how long first bytes take through a batcher (docs/batching.md,
// "Settings": `wait_share`).
describe("an isolate's first-byte estimate", () => {
  it("learns from HEADs of answers served and not from refusals, which come fast", () => {
    const memo = new BatcherMemo();
    memo.heardFirstByte("us:m:1", { status: 200 }, 100);
    // Busy (the origin at its cap, or the Batcher's refusal), failed, the request's error.
    for (const status of [429, 503, 502, 400]) memo.heardFirstByte("us:m:1", { status }, 1);
    expect(memo.firstByteMs.get("us:m:1")).toBe(100);
    memo.heardFirstByte("us:m:1", { status: 200 }, 200);
    expect(memo.firstByteMs.get("us:m:1")).toBeCloseTo(120, 6);
  });
});
