import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { CommitStamp } from "../../../contracts/commit-stamp.ts";
import {
  SETTLE_CALL_MAX,
  SETTLE_CONFIRM_MARGIN_MS,
  SETTLE_FLUSH_MS,
  SETTLE_LINGER_MS,
  SETTLE_RETRY_MS,
  SettleQueue,
} from "../../../functions/accounts/settle-queue.ts";

type Settlement = { requestId: string; outcome: "ok" };
const settlement = (requestId: string): Settlement => ({ requestId, outcome: "ok" });

const WRITE_DELAY_MS = 50;
// When the timer of a carried settlement that nothing confirmed sends it on its own.
const SENT_ALONE_AFTER_MS = SETTLE_FLUSH_MS + WRITE_DELAY_MS + SETTLE_CONFIRM_MARGIN_MS;

const stamp = (incarnation: string, committed: number, pending: number): CommitStamp => ({
  incarnation,
  committed,
  pending,
});

// Standalone calls, answered as the account does: committed before answering.
function recorder(failures = 0, incarnation = "a") {
  const calls: { keyId: string; ids: string[] }[] = [];
  let failuresLeft = failures;
  let committed = 10;
  return {
    calls,
    send: async (keyId: string, inputs: Settlement[]) => {
      if (failuresLeft-- > 0) throw new Error("account unavailable");
      calls.push({ keyId, ids: inputs.map((input) => input.requestId) });
      committed++;
      return stamp(incarnation, committed, committed);
    },
  };
}

// Whether a settlement's promise has resolved.
function watch(promise: Promise<void>): { done: boolean } {
  const state = { done: false };
  void promise.then(() => {
    state.done = true;
  });
  return state;
}

const newQueue = () => new SettleQueue<Settlement>({ writeDelayMs: WRITE_DELAY_MS });
const ids = (inputs: Settlement[]) => inputs.map((input) => input.requestId);

describe("SettleQueue", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("keeps a carried settlement until an answer of the same incarnation reports its commit", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const a = watch(queue.settle("k1", settlement("a"), send));
    const carried = queue.take("k1");
    expect(ids(carried.inputs)).toEqual(["a"]);
    carried.answered(stamp("a", 3, 4));
    expect(queue.unconfirmed("k1")).toBe(1);
    // Commit 4 is not durable yet: a later answer that says so confirms nothing.
    queue.take("k1").answered(stamp("a", 3, 4));
    expect(queue.unconfirmed("k1")).toBe(1);
    await vi.advanceTimersByTimeAsync(SETTLE_FLUSH_MS);
    expect(a.done).toBe(false);
    queue.take("k1").answered(stamp("a", 4, 5));
    expect(queue.unconfirmed("k1")).toBe(0);
    await vi.advanceTimersByTimeAsync(SENT_ALONE_AFTER_MS);
    expect(a.done).toBe(true);
    expect(calls).toEqual([]);
  });

  it("lets the next call carry again a settlement an answer of another incarnation may have lost", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const a = watch(queue.settle("k1", settlement("a"), send));
    queue.take("k1").answered(stamp("a", 3, 4));
    // The account restarted: its answer speaks of another incarnation.
    const restarted = queue.take("k1");
    expect(restarted.inputs).toEqual([]);
    restarted.answered(stamp("b", 0, 0));
    expect(queue.queued("k1")).toBe(1);
    expect(queue.unconfirmed("k1")).toBe(0);
    const again = queue.take("k1");
    expect(ids(again.inputs)).toEqual(["a"]);
    again.answered(stamp("b", 0, 1));
    queue.take("k1").answered(stamp("b", 1, 1));
    await vi.advanceTimersByTimeAsync(SENT_ALONE_AFTER_MS);
    expect(a.done).toBe(true);
    expect(calls).toEqual([]);
  });

  it("sends a carried settlement on its own when no later answer confirms it", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const a = watch(queue.settle("k1", settlement("a"), send));
    queue.take("k1").answered(stamp("a", 3, 4));
    await vi.advanceTimersByTimeAsync(SENT_ALONE_AFTER_MS - 1);
    expect(calls).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(calls).toEqual([{ keyId: "k1", ids: ["a"] }]);
    expect(a.done).toBe(true);
    expect(queue.unconfirmed("k1")).toBe(0);
  });

  it("sends a settlement no admit call carried on its own, with the key's others", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const settled = Promise.all([
      queue.settle("k1", settlement("a"), send),
      queue.settle("k1", settlement("b"), send),
      queue.settle("k2", settlement("c"), send),
    ]);
    // Alone, k2's goes at once; k1's two wait on for more of theirs, then share one call.
    await vi.advanceTimersByTimeAsync(SETTLE_FLUSH_MS);
    expect(calls).toEqual([{ keyId: "k2", ids: ["c"] }]);
    await vi.advanceTimersByTimeAsync(SETTLE_LINGER_MS - SETTLE_FLUSH_MS);
    await settled;
    expect(calls).toEqual([
      { keyId: "k2", ids: ["c"] },
      { keyId: "k1", ids: ["a", "b"] },
    ]);
  });

  it("gathers the settlements of a key that keep coming into one call", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const done = [watch(queue.settle("k1", settlement("a"), send))];
    // One every 5 ms, as under steady traffic: none goes alone after its first 20 ms.
    for (const id of ["b", "c", "d", "e"]) {
      await vi.advanceTimersByTimeAsync(5);
      done.push(watch(queue.settle("k1", settlement(id), send)));
    }
    await vi.advanceTimersByTimeAsync(SETTLE_LINGER_MS - 21);
    expect(calls).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(calls).toEqual([{ keyId: "k1", ids: ["a", "b", "c", "d", "e"] }]);
    await vi.advanceTimersByTimeAsync(SETTLE_LINGER_MS);
    expect(done.every((d) => d.done)).toBe(true);
    expect(calls).toHaveLength(1);
  });

  it("sends a full call's worth of a key's settlements at once, whatever their wait", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    // A burst ending together: no timer runs, yet every full call's worth leaves at once.
    const burst = Array.from({ length: SETTLE_CALL_MAX * 2 + 5 }, (_, i) => `r${i}`);
    const done = burst.map((id) => watch(queue.settle("k1", settlement(id), send)));
    await vi.advanceTimersByTimeAsync(0);
    expect(calls.map((call) => call.ids.length)).toEqual([SETTLE_CALL_MAX, SETTLE_CALL_MAX]);
    expect(queue.queued("k1")).toBe(5);
    // The rest wait as usual, then go together.
    await vi.advanceTimersByTimeAsync(SETTLE_LINGER_MS);
    expect(calls.at(-1)?.ids).toEqual(burst.slice(SETTLE_CALL_MAX * 2));
    await vi.advanceTimersByTimeAsync(SETTLE_LINGER_MS);
    expect(done.every((d) => d.done)).toBe(true);
  });

  it("sends the key's unconfirmed settlements along with one sent on its own", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const a = watch(queue.settle("k1", settlement("a"), send));
    queue.take("k1").answered(stamp("a", 3, 4));
    const b = watch(queue.settle("k1", settlement("b"), send));
    await vi.advanceTimersByTimeAsync(SETTLE_FLUSH_MS);
    expect(calls).toEqual([{ keyId: "k1", ids: ["b", "a"] }]);
    expect(b.done).toBe(true);
    await vi.advanceTimersByTimeAsync(SENT_ALONE_AFTER_MS);
    expect(a.done).toBe(true);
    expect(calls).toHaveLength(1);
  });

  it("sends again a settlement whose carrying call never answered", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const a = watch(queue.settle("k1", settlement("a"), send));
    queue.take("k1"); // The carrying call failed: no answer.
    await vi.advanceTimersByTimeAsync(SENT_ALONE_AFTER_MS);
    expect(calls).toEqual([{ keyId: "k1", ids: ["a"] }]);
    expect(a.done).toBe(true);
  });

  it("tries a failed call once more", async () => {
    const queue = newQueue();
    const { calls, send } = recorder(1);
    const a = watch(queue.settle("k1", settlement("a"), send));
    await vi.advanceTimersByTimeAsync(SETTLE_FLUSH_MS);
    expect(calls).toEqual([]);
    await vi.advanceTimersByTimeAsync(SETTLE_RETRY_MS);
    expect(calls).toEqual([{ keyId: "k1", ids: ["a"] }]);
    expect(a.done).toBe(true);
  });

  it("in steady traffic, sends each settlement once, on an admit call", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    // The account: writes queued since the last commit, which it makes every write delay.
    let committed = 0;
    let writes = false;
    const carried: string[] = [];
    const watched: { done: boolean }[] = [];
    for (let t = 0; t < 1_000; t += 5) {
      // A request ends and another is admitted every 5 ms.
      watched.push(watch(queue.settle("k1", settlement(`r${t}`), send)));
      await vi.advanceTimersByTimeAsync(2);
      const call = queue.take("k1");
      carried.push(...ids(call.inputs));
      writes = true;
      call.answered(stamp("a", committed, committed + 1));
      await vi.advanceTimersByTimeAsync(3);
      if ((t + 5) % WRITE_DELAY_MS === 0 && writes) {
        committed++;
        writes = false;
      }
    }
    // Every settlement rode on an admit, once; the answers of later admits confirmed all but
    // the last commit's, which no answer reported: those go together, on their own.
    await vi.advanceTimersByTimeAsync(SENT_ALONE_AFTER_MS + SETTLE_RETRY_MS);
    expect(watched.every((w) => w.done)).toBe(true);
    expect(carried).toEqual(Array.from({ length: 200 }, (_, i) => `r${i * 5}`));
    expect(calls).toEqual([
      { keyId: "k1", ids: Array.from({ length: 10 }, (_, i) => `r${950 + i * 5}`) },
    ]);
  });

  it("waits as long as it is told for a call to carry it, and goes on its own only after that", async () => {
    const queue = newQueue();
    const { calls, send } = recorder();
    const a = watch(queue.settle("k1", settlement("a"), send, 1_000));
    const b = watch(queue.settle("k2", settlement("b"), send, 1_000));
    await vi.advanceTimersByTimeAsync(500);
    expect(calls).toEqual([]);
    // A lease renewal of k1 carries its settlement; its account committed before answering.
    const carried = queue.take("k1");
    expect(ids(carried.inputs)).toEqual(["a"]);
    carried.answered(stamp("a", 11, 11));
    await vi.advanceTimersByTimeAsync(500);
    expect(a.done).toBe(true);
    expect(b.done).toBe(true);
    // Nothing carried k2's: it went on its own once its wait was over, k1's never did.
    expect(calls).toEqual([{ keyId: "k2", ids: ["b"] }]);
  });
});
