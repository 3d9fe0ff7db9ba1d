import { describe, expect, it } from "vitest";
import { SettleQueue } from "../../functions/settle-queue.ts";

type Settlement = { requestId: string; outcome: "ok" };
const settlement = (requestId: string): Settlement => ({ requestId, outcome: "ok" });

function recorder(failures = 0) {
  const calls: { keyId: string; ids: string[] }[] = [];
  let failuresLeft = failures;
  return {
    calls,
    send: async (keyId: string, inputs: Settlement[]) => {
      if (failuresLeft-- > 0) throw new Error("account unavailable");
      calls.push({ keyId, ids: inputs.map((input) => input.requestId) });
    },
  };
}

describe("SettleQueue", () => {
  it("lets an admit call carry queued settlements, which are then not sent again", async () => {
    const queue = new SettleQueue<Settlement>();
    const { calls, send } = recorder();
    const a = queue.settle("k1", settlement("a"), send);
    const b = queue.settle("k1", settlement("b"), send);
    const carried = queue.take("k1");
    expect(carried.inputs.map((input) => input.requestId)).toEqual(["a", "b"]);
    carried.confirm();
    await Promise.all([a, b]);
    expect(calls).toEqual([]);
    expect(queue.queued("k1")).toBe(0);
  });

  it("sends a settlement no admit call carried on its own, with the key's others", async () => {
    const queue = new SettleQueue<Settlement>();
    const { calls, send } = recorder();
    await Promise.all([
      queue.settle("k1", settlement("a"), send),
      queue.settle("k1", settlement("b"), send),
      queue.settle("k2", settlement("c"), send),
    ]);
    expect(calls).toEqual([
      { keyId: "k1", ids: ["a", "b"] },
      { keyId: "k2", ids: ["c"] },
    ]);
  });

  it("sends again a settlement whose carrying call never confirmed it", async () => {
    const queue = new SettleQueue<Settlement>();
    const { calls, send } = recorder();
    const a = queue.settle("k1", settlement("a"), send);
    queue.take("k1"); // The carrying call failed: no confirm.
    await a;
    expect(calls).toEqual([{ keyId: "k1", ids: ["a"] }]);
  });

  it("tries a failed call once more", async () => {
    const queue = new SettleQueue<Settlement>();
    const { calls, send } = recorder(1);
    await queue.settle("k1", settlement("a"), send);
    expect(calls).toEqual([{ keyId: "k1", ids: ["a"] }]);
  });
});
