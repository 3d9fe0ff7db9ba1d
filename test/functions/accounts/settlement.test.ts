import { describe, expect, it } from "vitest";
import { type SettledRequest, Settlement } from "../../../functions/accounts/settlement.ts";

const ended: Omit<SettledRequest, "requestId"> = {
  model: "m",
  outcome: "ok",
  usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, cached_tokens: 0 },
  region: "eu",
  origin: "eu-1",
  status: 200,
  originBegan: true,
};

function harness() {
  const pending: Promise<unknown>[] = [];
  return { pending, waitUntil: (promise: Promise<unknown>) => void pending.push(promise) };
}

describe("settlement", () => {
  it("runs every hook once with the request id, however often settle is called", async () => {
    const { pending, waitUntil } = harness();
    const settlement = new Settlement("req_1", waitUntil);
    const seen: SettledRequest[] = [];
    settlement.onSettled((s) => void seen.push(s));
    settlement.onSettled(async (s) => void seen.push(s));
    settlement.settle(ended);
    settlement.settle({ ...ended, outcome: "error" });
    await Promise.all(pending);
    expect(seen).toEqual([
      { requestId: "req_1", ...ended },
      { requestId: "req_1", ...ended },
    ]);
    expect(settlement.settled).toBe(true);
  });

  it("tells who waits for its record as soon as it is settled, before slow hooks end", async () => {
    const { waitUntil } = harness();
    const settlement = new Settlement("req_w", waitUntil);
    // A hook that waits on something that never answers, as an account call might.
    settlement.onSettled(() => new Promise<void>(() => {}));
    const early = settlement.whenRecorded();
    settlement.settle(ended);
    expect(await early).toEqual({ requestId: "req_w", ...ended });
    expect(await settlement.whenRecorded()).toEqual({ requestId: "req_w", ...ended });
  });

  it("keeps running later hooks when one throws", async () => {
    const { pending, waitUntil } = harness();
    const settlement = new Settlement("req_2", waitUntil);
    const seen: string[] = [];
    settlement.onSettled(() => {
      throw new Error("ledger down");
    });
    settlement.onSettled((s) => void seen.push(s.requestId));
    settlement.settle(ended);
    await Promise.all(pending);
    expect(seen).toEqual(["req_2"]);
  });

  it("holds the context open from hold() until the hooks have run", async () => {
    const { pending, waitUntil } = harness();
    const settlement = new Settlement("req_3", waitUntil);
    let ran = false;
    settlement.onSettled(async () => {
      await Promise.resolve();
      ran = true;
    });
    settlement.hold();
    expect(pending).toHaveLength(1);
    settlement.settle(ended);
    await Promise.all(pending);
    expect(ran).toBe(true);
  });
});
