import { afterEach, describe, expect, it } from "vitest";
import {
  type AttemptEnd,
  type FoundItem,
  outranks,
  reconcile,
  settledOutcome,
} from "../../contracts/outcomes.ts";
import type { BatchItem, ItemOutcome, ItemUsage } from "../../contracts/protocol/schema.ts";
import { startOrigin } from "../../origin/server.ts";
import type { RunningOrigin } from "../../origin/server.ts";
import { eventually, postBatch, readBatch } from "../origin/batch-client.ts";
import { createFakeEngine } from "../origin/fake-engine.ts";
import type { FakeEngine } from "../origin/fake-engine.ts";

const usage = (completion: number): ItemUsage => ({
  prompt_tokens: 5,
  completion_tokens: completion,
  total_tokens: 5 + completion,
  cached_tokens: 0,
});

const end = (outcome: ItemOutcome, u: ItemUsage | null): AttemptEnd => ({ outcome, usage: u });

describe("reconcile", () => {
  it("bills the attempt that finished, else the one that generated the most", () => {
    const items: FoundItem[] = [
      { id: "req_a", origin: "o1", state: "ended", outcome: "cancelled", usage: usage(90) },
      { id: "req_a.1", origin: "o2", state: "ended", outcome: "ok", usage: usage(12) },
      { id: "req_b", origin: "o1", state: "ended", outcome: "error", usage: usage(3) },
      { id: "req_b.1", origin: "o2", state: "ended", outcome: "timeout", usage: usage(40) },
      { id: "req_c", origin: "o1", state: "ended", outcome: "ok", usage: usage(7) },
      { id: "req_c.1", origin: "o2", state: "running" },
    ];
    const found = reconcile(["req_a", "req_b", "req_c", "req_d"], items);
    expect(found.get("req_a")).toEqual({
      kind: "ended",
      item: "req_a.1",
      origin: "o2",
      outcome: "ok",
      usage: usage(12),
    });
    expect(found.get("req_b")).toMatchObject({ item: "req_b.1", outcome: "timeout" });
    expect(found.get("req_c")).toEqual({ kind: "running" });
    expect(found.get("req_d")).toEqual({ kind: "unknown" });
  });

  it("bills an attempt cut after its prefill over one refused before it, whichever came first", () => {
    const prefilled = usage(0);
    for (const order of [
      ["req_e", "req_e.1"],
      ["req_e.1", "req_e"],
    ]) {
      const items: FoundItem[] = order.map((id) =>
        id === "req_e"
          ? { id, origin: "o1", state: "ended", outcome: "error", usage: null }
          : { id, origin: "o2", state: "ended", outcome: "cancelled", usage: prefilled },
      );
      expect(reconcile(["req_e"], items).get("req_e")).toEqual({
        kind: "ended",
        item: "req_e.1",
        origin: "o2",
        outcome: "cancelled",
        usage: prefilled,
      });
    }
  });
});

const cached = (n: number): ItemUsage => ({ ...usage(51), cached_tokens: n });

describe("reconcile's choice among attempts alike in output", () => {
  const refused: FoundItem = {
    id: "req_f",
    origin: "o1",
    state: "ended",
    outcome: "error",
    usage: null,
  };
  const cachedSome: FoundItem = {
    id: "req_f.1",
    origin: "o2",
    state: "ended",
    outcome: "error",
    usage: cached(16),
  };
  const cachedNone: FoundItem = {
    id: "req_f.2",
    origin: "o3",
    state: "ended",
    outcome: "error",
    usage: cached(0),
  };
  const attempts = [refused, cachedSome, cachedNone];

  it("bills the one that computed more of the prompt, whichever origin answers first", () => {
    for (const order of [attempts, attempts.toReversed(), [cachedSome, refused, cachedNone]])
      expect(reconcile(["req_f"], order).get("req_f")).toMatchObject({
        item: "req_f.2",
        origin: "o3",
      });
  });

  it("names the earlier attempt when two are alike in every count", () => {
    const alike = attempts.map((a) => (a.state === "ended" ? { ...a, usage: cached(0) } : a));
    for (const order of [alike, alike.toReversed()])
      expect(reconcile(["req_f"], order).get("req_f")).toMatchObject({
        item: "req_f",
        origin: "o1",
      });
  });
});

describe("outranks", () => {
  it("weighs a finished answer, then output, then the prompt read", () => {
    expect(outranks(end("ok", usage(0)), end("cancelled", usage(500)))).toBe(true);
    expect(outranks(end("cancelled", usage(3)), end("error", usage(2)))).toBe(true);
    expect(outranks(end("cancelled", usage(0)), end("error", null))).toBe(true);
    expect(outranks(end("error", null), end("cancelled", usage(0)))).toBe(false);
    expect(outranks(end("error", usage(0)), end("timeout", usage(0)))).toBe(false);
    expect(outranks(end("error", null), end("error", null))).toBe(false);
    const cachedSome = { ...usage(4), cached_tokens: 3 };
    expect(outranks(end("error", usage(4)), end("error", cachedSome))).toBe(true);
    expect(outranks(end("error", cachedSome), end("error", usage(4)))).toBe(false);
  });
});

function chat(id: string, body: Record<string, unknown>): BatchItem {
  return {
    id,
    path: "/v1/chat/completions",
    body: JSON.stringify({ model: "fake-model", messages: [], ...body }),
  };
}

describe("settledOutcome", () => {
  let origin: RunningOrigin | undefined;
  let engine: FakeEngine;

  afterEach(async () => {
    await origin?.close();
    origin = undefined;
  });

  it("cancels an item still running on its origin, then answers what it generated", async () => {
    engine = createFakeEngine(5);
    origin = await startOrigin({ engine, originId: "o1", region: "eu", port: 0 });
    const reading = readBatch(
      await postBatch(origin.url, "b-run", [
        chat("req_run", { stream: true, max_tokens: 100_000 }),
        chat("req_next", { stream: true, max_tokens: 100_000 }),
      ]),
    );
    await eventually(() => engine.running() === 2, "both items running");
    const source = { id: "o1", url: origin.url };
    const { found, complete } = await settledOutcome(
      [source],
      "req_run",
      ["req_run"],
      {},
      {
        intervalMs: 20,
      },
    );
    expect(complete).toBe(true);
    expect(found).toMatchObject({ kind: "ended", item: "req_run", outcome: "cancelled" });
    const generated = found.kind === "ended" ? (found.usage?.completion_tokens ?? 0) : 0;
    expect(generated).toBeGreaterThan(0);
    expect(engine.aborted).toEqual(["req_run"]);
    // The other item of the batch runs on.
    expect(engine.running()).toBe(1);
    await settledOutcome([source], "req_next", null, {});
    await reading;
  });

  it("says an answer may still come when the origin does not answer", async () => {
    const gone = { id: "gone", url: "http://127.0.0.1:9" };
    const { found, complete } = await settledOutcome(
      [gone],
      "req_x",
      null,
      {},
      {
        tries: 2,
        intervalMs: 1,
      },
    );
    expect(found).toEqual({ kind: "unknown" });
    expect(complete).toBe(false);
  });
});
