import { describe, expect, it } from "vitest";
import { MAX_BATCH_ITEMS } from "../../../../contracts/protocol/framing.ts";
import { BatchingSettingsSchema } from "../../../../contracts/config/batching.ts";
import { windowConfig } from "../../../support/window-config.ts";
import {
  cancel,
  onItemDone,
  onOriginLoad,
} from "../../../../durable-objects/batcher/window/events.ts";
import { enqueue, tick } from "../../../../durable-objects/batcher/window/flush.ts";
import { queuedCount } from "../../../../durable-objects/batcher/window/state.ts";
import { currentWindowMs } from "../../../../durable-objects/batcher/window/terms.ts";
import type { EnqueueDecision } from "../../../../durable-objects/batcher/window/types.ts";
import {
  stateWith,
  report,
  request,
  load,
  saturated,
  add,
  without,
  ids,
  expectQueued,
} from "../../../support/window-state.ts";

describe("window configuration", () => {
  it("fills in defaults: 32 per batch, 65536 tokens, a 10 ms window and three lanes", () => {
    const config = windowConfig();
    expect(config.maxBatchSize).toBe(32);
    expect(config.maxBatchTokens).toBe(65_536);
    expect(config.maxWindowMs).toBe(10);
    expect(config.lanes).toHaveLength(3);
    expect(config.lanes.map((lane) => lane.onTimeout)).toEqual(["reject", "reject", "wait"]);
  });

  it("refuses an empty or oversized batch size", () => {
    const schema = BatchingSettingsSchema;
    expect(schema.safeParse({ max_batch_size: 0 }).success).toBe(false);
    expect(schema.safeParse({ max_batch_size: MAX_BATCH_ITEMS + 1 }).success).toBe(false);
    expect(schema.safeParse({ max_batch_size: 1 }).success).toBe(true);
  });

  it("treats a request for an unconfigured lane or with negative tokens as a bug", () => {
    const state = stateWith();
    expect(() => enqueue(state, request("x", { lane: 3 }), 0)).toThrow(RangeError);
    expect(() => enqueue(state, request("x", { promptTokens: -1 }), 0)).toThrow(RangeError);
  });
});

describe("dispatch and flush", () => {
  it("dispatches a lone request at once when the origin is idle", () => {
    const { state, decision } = add(load(stateWith(), "a", {}), request("r1"), 0);
    expect(decision).toEqual({
      kind: "dispatch-now",
      batch: {
        seq: 1,
        originId: "a",
        reason: "idle",
        items: [{ id: "r1", lane: 0, promptTokens: 100, maxTokens: 100 }],
      },
    });
    expect(queuedCount(state)).toBe(0);
    expect(tick(state, 0).nextWakeAt).toBeNull();
  });

  it("dispatches a lone request to an origin that has never reported", () => {
    expect(add(stateWith(), request("r1"), 0).decision.kind).toBe("dispatch-now");
  });

  it("flushes as soon as the batch size is reached", () => {
    let state = saturated({ maxBatchSize: 4 });
    for (const id of ["r1", "r2", "r3"]) {
      const step = add(state, request(id), 1);
      state = step.state;
      expect(expectQueued(step.decision).flushAt).toBe(11);
    }
    const fourth = add(state, request("r4"), 1);
    expect(expectQueued(fourth.decision).flushAt).toBe(1);
    const { batches, state: after } = tick(fourth.state, 1);
    expect(batches).toHaveLength(1);
    expect(batches[0]?.reason).toBe("size");
    expect(batches[0] && ids(batches[0])).toEqual(["r1", "r2", "r3", "r4"]);
    expect(queuedCount(after)).toBe(0);
  });

  it("flushes when prompt plus max_tokens reach the token budget, keeping the batch within it", () => {
    let state = saturated({ maxBatchTokens: 1000 });
    let decision: EnqueueDecision | null = null;
    for (const id of ["r1", "r2", "r3", "r4"]) {
      ({ state, decision } = add(state, request(id, { promptTokens: 200 }), 0));
    }
    expect(decision && expectQueued(decision).flushAt).toBe(0);
    const result = tick(state, 0);
    expect(result.batches.map((b) => [b.reason, ids(b)])).toEqual([["tokens", ["r1", "r2", "r3"]]]);
    expect(result.nextWakeAt).toBe(10);
    expect(tick(result.state, 10).batches.map(ids)).toEqual([["r4"]]);
  });

  it("sends a request larger than the token budget alone rather than never", () => {
    const state = saturated({ maxBatchTokens: 100 });
    const queued = add(state, request("big", { promptTokens: 500 }), 0);
    expect(tick(queued.state, 0).batches.map(ids)).toEqual([["big"]]);
  });

  it("flushes a partial batch when the window's deadline arrives", () => {
    let state = saturated();
    state = add(state, request("r1"), 0).state;
    state = add(state, request("r2"), 4).state;
    const early = tick(state, 5);
    expect(early.batches).toEqual([]);
    expect(early.nextWakeAt).toBe(10);
    const due = tick(early.state, 10);
    expect(due.batches.map((b) => [b.reason, ids(b)])).toEqual([["window", ["r1", "r2"]]]);
    expect(due.nextWakeAt).toBeNull();
  });
});

describe("adaptive window", () => {
  it("starts at 0, grows under a burst, never beyond maxWindowMs, and shrinks when load falls", () => {
    let state = load(stateWith({ maxWindowMs: 10, rateWindowMs: 100 }), "a", {});
    expect(currentWindowMs(state, 0)).toBe(0);
    const windows: number[] = [];
    const kinds: string[] = [];
    let now = 0;
    for (let i = 0; i < 60; i++) {
      now = i * 0.1;
      const step = add(state, request(`r${i}`), now);
      state = step.state;
      kinds.push(step.decision.kind);
      windows.push(step.decision.kind === "queued" ? step.decision.windowMs : 0);
      state = tick(state, now).state;
    }
    expect(kinds[0]).toBe("dispatch-now");
    expect(windows[0]).toBe(0);
    expect(Math.max(...windows)).toBe(10);
    expect(windows.every((w) => w >= 0 && w <= 10)).toBe(true);
    // Once the burst outruns the origin the window only widens while arrivals continue.
    const firstQueued = kinds.indexOf("queued");
    expect(firstQueued).toBeGreaterThan(0);
    const during = windows.slice(firstQueued);
    expect(during.every((w, i) => i === 0 || w >= (during[i - 1] ?? 0))).toBe(true);

    // Load falls: everything drains and finishes, and the origin says it is idle again.
    now = 20;
    const drained = tick(state, now);
    state = drained.state;
    for (const origin of state.origins) {
      for (const item of origin.inFlight) state = onItemDone(state, origin.id, item.id, now).state;
    }
    state = load(state, "a", {}, now);
    const later = [now, now + 100, now + 200, now + 400, now + 1000].map((t) =>
      currentWindowMs(state, t),
    );
    expect(later.every((w, i) => i === 0 || w <= (later[i - 1] ?? 0))).toBe(true);
    expect(later.at(-1)).toBe(0);
    expect(add(state, request("after"), now + 1000).decision.kind).toBe("dispatch-now");
  });

  it("stays at 0 while the origins have more free slots than requests arrive", () => {
    // The overload term alone: the call term is the subject of its own tests below.
    let state = load(stateWith({ rateWindowMs: 100, callIntervalMs: 0 }), "a", {
      max_num_seqs: 256,
    });
    for (let i = 0; i < 50; i++) {
      const step = add(state, request(`r${i}`), i);
      expect(step.decision.kind).toBe("dispatch-now");
      state = onItemDone(step.state, "a", `r${i}`, i + 0.5).state;
    }
    expect(currentWindowMs(state, 50)).toBe(0);
  });

  it("holds a request for the full window while the only origin is saturated", () => {
    const { decision } = add(saturated({ maxWindowMs: 7 }), request("r1"), 3);
    expect(decision).toEqual({ kind: "queued", flushAt: 10, windowMs: 7 });
  });
});

describe("state", () => {
  it("never mutates the state it is given", () => {
    const state = saturated();
    const before = structuredClone(state);
    const queued = add(state, request("r1"), 0).state;
    tick(queued, 10);
    cancel(queued, "r1", 1);
    onOriginLoad(queued, "a", report(), 1);
    tick(queued, 20, without("a"));
    expect(state).toEqual(before);
  });
});
