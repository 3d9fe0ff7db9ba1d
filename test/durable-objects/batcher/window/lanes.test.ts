import { describe, expect, it } from "vitest";
import { onItemDone } from "../../../../durable-objects/batcher/window/events.ts";
import { tick } from "../../../../durable-objects/batcher/window/flush.ts";
import { queuedCount } from "../../../../durable-objects/batcher/window/state.ts";
import { MIN_RETRY_AFTER_MS } from "../../../../durable-objects/batcher/window/types.ts";
import {
  stateWith,
  request,
  load,
  saturated,
  add,
  without,
  ids,
  expectQueued,
} from "../../../support/window-state.ts";

/** Origin a's engine runs its 8 slots and queues 2 more, all the Batcher may send it. */
function fullOrigin(input: Parameters<typeof stateWith>[0] = {}) {
  return saturated({ maxOriginQueue: 2, ...input });
}

describe("origins to avoid", () => {
  it("sends a retry only where it may go, at once, even to the busier origin", () => {
    let state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "b", { running: 5 });
    const { decision } = add(state, request("r1", { avoidOrigins: ["a"] }), 0);
    expect(decision.kind === "dispatch-now" && decision.batch.originId).toBe("b");
  });

  it("lets a retry leave without a window when others are waiting", () => {
    let state = saturated({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "b", { running: 8, waiting: 2 });
    state = add(state, request("r1"), 0).state;
    const retry = add(state, request("r2", { avoidOrigins: ["b"] }), 0);
    expect(expectQueued(retry.decision).flushAt).toBe(0);
    const { batches } = tick(retry.state, 0);
    expect(batches.map((b) => [b.originId, ids(b)])).toEqual([["a", ["r1", "r2"]]]);
  });

  it("passes over a request that avoids the only origin with room without holding up the rest", () => {
    let state = fullOrigin({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "b", { running: 8, waiting: 2 });
    state = add(state, request("r1", { avoidOrigins: ["a"] }), 0).state;
    state = add(state, request("r2"), 0).state;
    state = add(state, request("r3"), 0).state;
    // a has room again; b, which r1 may still go to, is full.
    state = load(state, "a", { running: 0 });
    const first = tick(state, 10);
    expect(first.batches.map((b) => [b.originId, ids(b)])).toEqual([["a", ["r2", "r3"]]]);
    expect(first.notices).toEqual([]);
    expect(queuedCount(first.state)).toBe(1);
    const roomy = tick(load(first.state, "b", { running: 0 }), 100);
    expect(roomy.batches.map((b) => [b.originId, ids(b)])).toEqual([["b", ["r1"]]]);
  });

  it("refuses a queued request once every origin it may go to is unusable, and sends the rest", () => {
    let state = fullOrigin({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "b", { running: 8, waiting: 2 });
    state = add(state, request("r1", { avoidOrigins: ["a"] }), 0).state;
    state = add(state, request("r2"), 0).state;
    state = load(state, "a", { running: 0 });
    // b's breaker opened: r1 has no origin left, r2 still has a.
    const result = tick(state, 10, without("b"));
    expect(result.notices.map((n) => [n.kind, n.item.id])).toEqual([["no-origin", "r1"]]);
    expect(result.batches.map((b) => [b.originId, ids(b)])).toEqual([["a", ["r2"]]]);
    expect(queuedCount(result.state)).toBe(0);
  });

  it("refuses an overdue request of a wait lane once no origin is usable", () => {
    let state = fullOrigin({ lanes: [{ queueTimeoutMs: 100, onTimeout: "wait" }] });
    state = add(state, request("x"), 0).state;
    const overdue = tick(state, 100);
    expect(overdue.notices.map((n) => [n.kind, n.item.id])).toEqual([["overdue", "x"]]);
    const down = tick(overdue.state, 200, without("a"));
    expect(down.notices.map((n) => [n.kind, n.item.id])).toEqual([["no-origin", "x"]]);
    expect(queuedCount(down.state)).toBe(0);
  });

  it("refuses every queued request, in every lane, when no origin is usable", () => {
    let state = fullOrigin({ lanes: [{}, { onTimeout: "wait" }] });
    state = add(state, request("x", { lane: 0 }), 0).state;
    state = add(state, request("y", { lane: 1 }), 0).state;
    const result = tick(state, 10, without("a"));
    expect(result.notices.map((n) => [n.kind, n.item.id])).toEqual([
      ["no-origin", "x"],
      ["no-origin", "y"],
    ]);
    expect(result.batches).toEqual([]);
    expect(result.nextWakeAt).toBeNull();
    expect(queuedCount(result.state)).toBe(0);
  });
});

describe("lanes", () => {
  it("sends higher lanes first and keeps FIFO order within a lane", () => {
    let state = saturated({ maxBatchSize: 3 });
    for (const [id, lane] of [
      ["a2", 2],
      ["b0", 0],
      ["c1", 1],
      ["d0", 0],
      ["e2", 2],
    ] as const) {
      state = add(state, request(id, { lane }), 0).state;
    }
    const { batches } = tick(state, 10);
    expect(batches.map(ids)).toEqual([
      ["b0", "d0", "c1"],
      ["a2", "e2"],
    ]);
  });

  it("rejects a timed-out request in a reject lane and keeps one in a wait lane", () => {
    let state = fullOrigin({
      lanes: [
        { queueTimeoutMs: 100, onTimeout: "reject" },
        { queueTimeoutMs: 100, onTimeout: "wait" },
      ],
    });
    state = add(state, request("x", { lane: 0 }), 0).state;
    state = add(state, request("y", { lane: 1 }), 0).state;
    const blocked = tick(state, 10);
    expect(blocked.batches).toEqual([]);
    expect(blocked.nextWakeAt).toBe(100);

    const timeout = tick(blocked.state, 100);
    expect(timeout.notices.map((n) => [n.kind, n.item.id])).toEqual([
      ["timed-out", "x"],
      ["overdue", "y"],
    ]);
    // Nothing to wake for but the full origin's report growing too old to trust; the
    // report that frees room is an event that ticks the window anyway.
    expect(timeout.nextWakeAt).toBe(timeout.state.config.loadReportTtlMs);
    expect(tick(timeout.state, 500).notices).toEqual([]);

    const back = tick(load(timeout.state, "a", { running: 0 }, 1000), 1000);
    expect(back.batches.map(ids)).toEqual([["y"]]);
  });

  it("lets a caller's own deadline end the wait before the lane's timeout", () => {
    const state = add(fullOrigin(), request("x", { deadline: 50 }), 0).state;
    expect(tick(state, 50).notices.map((n) => n.kind)).toEqual(["timed-out"]);
  });

  it("times out a request whose deadline has already passed instead of sending it", () => {
    const queued = add(stateWith(), request("late", { deadline: 5 }), 5);
    expect(queued.decision.kind).toBe("queued");
    expect(tick(queued.state, 5).notices.map((n) => [n.kind, n.item.id])).toEqual([
      ["timed-out", "late"],
    ]);
  });

  it("rejects a request to a full lane at once with retryAfterMs, leaving other lanes open", () => {
    let state = saturated({
      lanes: [{ maxQueue: 2, queueTimeoutMs: 5000 }, { maxQueue: 2 }],
    });
    state = add(state, request("r1"), 0).state;
    state = add(state, request("r2"), 0).state;
    const full = add(state, request("r3"), 0);
    expect(full.decision).toEqual({ kind: "rejected", reason: "queue_full", retryAfterMs: 5000 });
    expect(full.state).toBe(state);
    expect(add(state, request("r3", { lane: 1 }), 0).decision.kind).toBe("queued");

    // Once the lane drains, the estimate follows the observed drain rate.
    state = tick(state, 10).state;
    state = add(state, request("r4"), 10).state;
    state = add(state, request("r5"), 10).state;
    const again = add(state, request("r6"), 10);
    if (again.decision.kind !== "rejected" || again.decision.reason !== "queue_full") {
      throw new Error("expected a full lane");
    }
    expect(again.decision.retryAfterMs).toBeGreaterThanOrEqual(MIN_RETRY_AFTER_MS);
    expect(again.decision.retryAfterMs).toBeLessThan(5000);
    expect(tick(again.state, 20).batches.map(ids)).toEqual([["r4", "r5"]]);
  });
});

describe("KV-memory-aware admission", () => {
  it("holds back a prompt the origin's KV cache cannot take until capacity returns", () => {
    // 10 free blocks of 16 tokens: room for 160 prompt tokens.
    let state = load(stateWith(), "a", { kv_free_blocks: 10 });
    const first = add(state, request("r1"), 0);
    expect(first.decision.kind).toBe("dispatch-now");
    const second = add(first.state, request("r2"), 1);
    expect(second.decision.kind).toBe("queued");
    const blocked = tick(second.state, 1);
    expect(blocked.batches).toEqual([]);
    expect(blocked.nextWakeAt).toBe(30_001);

    state = onItemDone(blocked.state, "a", "r1", 2).state;
    expect(tick(state, 2).batches.map(ids)).toEqual([["r2"]]);
  });

  it("fills a batch only up to the origin's KV room and sends the rest to another origin", () => {
    let state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "a", { kv_free_blocks: 16, running: 0, waiting: 1, max_num_seqs: 4 });
    state = load(state, "b", { kv_free_blocks: 10_000, running: 3, waiting: 1, max_num_seqs: 4 });
    for (const id of ["r1", "r2", "r3", "r4"]) state = add(state, request(id), 0).state;
    const { batches } = tick(state, 10);
    expect(batches.map((b) => [b.originId, ids(b)])).toEqual([
      ["a", ["r1", "r2"]],
      ["b", ["r3", "r4"]],
    ]);
  });

  it("sends a lone request to the origin with room when the least loaded one has none", () => {
    let state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "a", { kv_free_blocks: 1 });
    state = load(state, "b", { running: 5 });
    const { decision } = add(state, request("r1"), 0);
    expect(decision.kind === "dispatch-now" && decision.batch.originId).toBe("b");
  });

  it("refuses a prompt no origin's KV cache could ever hold", () => {
    const state = load(stateWith(), "a", { kv_total_blocks: 10 });
    expect(add(state, request("huge", { promptTokens: 161 }), 0).decision).toEqual({
      kind: "rejected",
      reason: "too_large",
      capacityTokens: 160,
    });
  });

  it("settles a queued prompt as too large once the reports show it can never fit", () => {
    let state = add(stateWith(), request("huge", { promptTokens: 5000 }), 0, without("a")).state;
    state = load(state, "a", { kv_total_blocks: 10 }, 1);
    const { notices } = tick(state, 1, without("a"));
    expect(notices.map((n) => [n.kind, n.item.id])).toEqual([["too-large", "huge"]]);
  });

  it("probes an origin whose old report said full once nothing is in flight there", () => {
    let state = load(stateWith({ loadReportTtlMs: 500 }), "a", { kv_free_blocks: 0 });
    state = add(state, request("r1"), 0).state;
    const blocked = tick(state, 100);
    expect(blocked.batches).toEqual([]);
    expect(blocked.nextWakeAt).toBe(500);
    expect(tick(blocked.state, 500).batches.map(ids)).toEqual([["r1"]]);
  });
});
