import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ADMIT_WAIT_MS, AdmitLines } from "../../functions/admit-line.ts";

/** A fake account call: records each group, answers when `release` is called. */
function fakeAccount() {
  const groups: string[][] = [];
  const pending: {
    inputs: string[];
    resolve: (answers: string[]) => void;
    reject: (error: Error) => void;
  }[] = [];
  const send = (inputs: string[]) =>
    new Promise<string[]>((resolve, reject) => {
      groups.push(inputs);
      pending.push({ inputs, resolve, reject });
    });
  const release = () => {
    const call = pending.shift();
    call?.resolve(call.inputs.map((input) => `ok:${input}`));
  };
  const releaseLast = () => {
    const call = pending.pop();
    call?.resolve(call.inputs.map((input) => `ok:${input}`));
  };
  const fail = () => pending.shift()?.reject(new Error("account unavailable"));
  return { groups, send, release, releaseLast, fail };
}

// Lets queued continuations (woken waiters) run.
const settle = () => vi.advanceTimersByTimeAsync(0);

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("AdmitLines", () => {
  it("sends a lone request at once", async () => {
    const lines = new AdmitLines<string, string>();
    const account = fakeAccount();
    const answer = lines.admit("k", "a", account.send);
    expect(account.groups).toEqual([["a"]]);
    account.release();
    await expect(answer).resolves.toBe("ok:a");
  });

  it("sends the requests that met during a call together in the next one", async () => {
    const lines = new AdmitLines<string, string>();
    const account = fakeAccount();
    const first = lines.admit("k", "a", account.send);
    const rest = ["b", "c", "d"].map((input) => lines.admit("k", input, account.send));
    expect(lines.waiting("k")).toBe(3);
    expect(account.groups).toEqual([["a"]]);
    account.release();
    await settle();
    expect(account.groups).toEqual([["a"], ["b", "c", "d"]]);
    account.release();
    await expect(first).resolves.toBe("ok:a");
    await expect(Promise.all(rest)).resolves.toEqual(["ok:b", "ok:c", "ok:d"]);
    expect(lines.waiting("k")).toBe(0);
  });

  it("keeps keys apart", async () => {
    const lines = new AdmitLines<string, string>();
    const account = fakeAccount();
    const answers = [lines.admit("k1", "a", account.send), lines.admit("k2", "b", account.send)];
    expect(account.groups).toEqual([["a"], ["b"]]);
    account.release();
    account.release();
    await expect(Promise.all(answers)).resolves.toEqual(["ok:a", "ok:b"]);
  });

  it("fails every member of a group whose call failed, and the line goes on", async () => {
    const lines = new AdmitLines<string, string>();
    const account = fakeAccount();
    const first = lines.admit("k", "a", account.send);
    const second = lines.admit("k", "b", account.send);
    const third = lines.admit("k", "c", account.send);
    account.release();
    await settle();
    account.fail();
    await expect(first).resolves.toBe("ok:a");
    await expect(second).rejects.toThrow("account unavailable");
    await expect(third).rejects.toThrow("account unavailable");
    const fourth = lines.admit("k", "d", account.send);
    account.release();
    await expect(fourth).resolves.toBe("ok:d");
  });

  it("goes alone when the call under way never answers, and a later request leads anew", async () => {
    const lines = new AdmitLines<string, string>();
    const account = fakeAccount();
    void lines.admit("k", "lost", account.send);
    const waiting = lines.admit("k", "b", account.send);
    await vi.advanceTimersByTimeAsync(ADMIT_WAIT_MS);
    // The waiter left the queue and made its own call.
    expect(account.groups).toEqual([["lost"], ["b"]]);
    expect(lines.waiting("k")).toBe(0);
    account.releaseLast();
    await expect(waiting).resolves.toBe("ok:b");
    await vi.advanceTimersByTimeAsync(1);
    const later = lines.admit("k", "c", account.send);
    expect(account.groups.at(-1)).toEqual(["c"]);
    account.releaseLast();
    await expect(later).resolves.toBe("ok:c");
  });
});
