import { describe, expect, it } from "vitest";
import type { LoadReport } from "../../../../contracts/protocol/schema.ts";
import {
  onItemDone,
  onItemsAcked,
  onOriginLoad,
} from "../../../../durable-objects/batcher/window/events.ts";
import { enqueue, tick } from "../../../../durable-objects/batcher/window/flush.ts";
import {
  createWindowState,
  queuedCount,
} from "../../../../durable-objects/batcher/window/state.ts";
import type {
  Batch,
  WindowRequest,
  WindowState,
} from "../../../../durable-objects/batcher/window/types.ts";
import { type WindowConfigInput, windowConfig } from "../../../support/window-config.ts";
import { report as engineReport } from "../../../support/window-state.ts";

// An engine of 8 slots, allowed to queue 4 of ours beyond them (held batches leave once 2
// have room again).
const FULL = { running: 8, waiting: 4 };

function stateWith(input: Partial<WindowConfigInput> = {}): WindowState {
  return createWindowState(windowConfig({ maxOriginQueue: 4, ...input }), 0);
}

function report(origin: string, over: Partial<LoadReport>): LoadReport {
  return engineReport({ origin, ...over });
}

function load(state: WindowState, origin: string, over: Partial<LoadReport>, now = 0) {
  return onOriginLoad(state, origin, report(origin, over), now).state;
}

function request(id: string, over: Partial<WindowRequest> = {}): WindowRequest {
  return { id, lane: 0, promptTokens: 10, maxTokens: 10, ...over };
}

function addAll(state: WindowState, requests: readonly WindowRequest[], now: number) {
  let next = state;
  for (const req of requests) {
    const { state: after, decision } = enqueue(next, req, now);
    expect(decision.kind).toBe("queued");
    next = after;
  }
  return next;
}

const ids = (batches: readonly Batch[]) => batches.map((b) => b.items.map((item) => item.id));

describe("backpressure", () => {
  it("holds requests in the lanes while every origin queues its share, and sends them once it has room", () => {
    let state = load(stateWith(), "a", FULL);
    state = addAll(state, [request("r1"), request("r2"), request("r3")], 0);
    const held = tick(state, 50);
    expect(held.batches).toEqual([]);
    expect(queuedCount(held.state)).toBe(3);
    // Two of its sequences ended: room for two, the first two in line.
    const freed = tick(load(held.state, "a", { running: 8, waiting: 2 }, 60), 60);
    expect(ids(freed.batches)).toEqual([["r1", "r2"]]);
    expect(queuedCount(freed.state)).toBe(1);
  });

  it("does not send a lone request to a full origin, and sends it to one with room", () => {
    const full = load(stateWith(), "a", FULL);
    expect(enqueue(full, request("r1"), 0).decision.kind).toBe("queued");
    const two = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    const mixed = load(load(two, "a", FULL), "b", { running: 1 });
    const { decision } = enqueue(mixed, request("r1"), 0);
    expect(decision).toMatchObject({ kind: "dispatch-now", batch: { originId: "b" } });
  });

  it("caps a batch at the origin's room and sends the rest as its own items end", () => {
    let state = load(stateWith(), "a", { running: 8 });
    state = addAll(
      state,
      ["r1", "r2", "r3", "r4", "r5", "r6"].map((id) => request(id)),
      0,
    );
    const first = tick(state, 20);
    expect(ids(first.batches)).toEqual([["r1", "r2", "r3", "r4"]]);
    let after = first.state;
    for (const id of ["r1", "r2"]) after = onItemDone(after, "a", id, 30).state;
    expect(ids(tick(after, 30).batches)).toEqual([["r5", "r6"]]);
  });

  it("waits for half the origin's queue to have room before a held batch leaves", () => {
    let state = load(stateWith(), "a", FULL);
    state = addAll(state, [request("r1"), request("r2")], 0);
    expect(tick(load(state, "a", { running: 8, waiting: 3 }, 10), 10).batches).toEqual([]);
    expect(ids(tick(load(state, "a", { running: 8, waiting: 2 }, 10), 10).batches)).toEqual([
      ["r1", "r2"],
    ]);
  });

  it("lets a higher lane overtake what waits while the origins are full", () => {
    let state = load(stateWith(), "a", FULL);
    state = addAll(state, [request("low1", { lane: 1 }), request("low2", { lane: 1 })], 0);
    state = addAll(state, [request("high", { lane: 0 })], 5);
    const freed = tick(load(state, "a", { running: 8, waiting: 2 }, 20), 20);
    expect(ids(freed.batches)).toEqual([["high", "low1"]]);
  });

  it("refuses at once with retry-after when a held lane is full", () => {
    let state = load(stateWith({ lanes: [{ maxQueue: 2 }] }), "a", FULL);
    state = addAll(state, [request("r1"), request("r2")], 0);
    const { decision } = enqueue(state, request("r3"), 1);
    expect(decision).toMatchObject({
      kind: "rejected",
      reason: "queue_full",
      retryAfterMs: expect.any(Number),
    });
    expect("retryAfterMs" in decision && decision.retryAfterMs).toBeGreaterThanOrEqual(1000);
  });

  it("ends a held request at its lane's timeout, before any origin started it", () => {
    let state = load(stateWith({ lanes: [{ queueTimeoutMs: 100 }] }), "a", FULL);
    state = addAll(state, [request("r1")], 0);
    const result = tick(state, 100);
    expect(result.batches).toEqual([]);
    expect(result.notices).toMatchObject([{ kind: "timed-out", item: { id: "r1" } }]);
    // Nothing left the lanes: come back after the shortest `retry-after`, a second.
    expect(result.notices[0]?.kind === "timed-out" && result.notices[0].retryAfterMs).toBe(1000);
    expect(queuedCount(result.state)).toBe(0);
  });

  it("does not hold on a report of full that is past its age while nothing of ours runs there", () => {
    let state = load(stateWith({ loadReportTtlMs: 1000 }), "a", FULL);
    state = addAll(state, [request("r1")], 0);
    const held = tick(state, 20);
    expect(held.batches).toEqual([]);
    expect(held.nextWakeAt).toBe(1000);
    expect(ids(tick(held.state, 1000).batches)).toEqual([["r1"]]);
  });

  it("counts what it sent on top of every report until the origin acknowledged it", () => {
    let state = load(stateWith(), "a", { running: 8 });
    state = addAll(
      state,
      ["r1", "r2", "r3", "r4", "r5"].map((id) => request(id)),
      0,
    );
    const sent = tick(state, 20);
    expect(ids(sent.batches)).toEqual([["r1", "r2", "r3", "r4"]]);
    // Their call's first report, written at origin time 100 before they started.
    const early = load(sent.state, "a", { running: 8, t: 100 }, 25);
    expect(tick(early, 25).batches).toEqual([]);
    const acked = onItemsAcked(early, "a", new Set(["r1", "r2", "r3", "r4"]), 100);
    // Another call's report written before then, arriving late, still does not count them.
    expect(tick(load(acked, "a", { running: 8, t: 90 }, 28), 28).batches).toEqual([]);
    // Reports written after count them.
    const full = load(acked, "a", { running: 8, waiting: 4, t: 110 }, 30);
    expect(tick(full, 30).batches).toEqual([]);
    const freed = load(acked, "a", { running: 8, waiting: 2, t: 120 }, 30);
    expect(ids(tick(freed, 30).batches)).toEqual([["r5"]]);
  });

  it("never holds for an engine that does not report its slots", () => {
    const state = load(stateWith(), "a", { running: 500, waiting: 500, max_num_seqs: 0 });
    expect(enqueue(state, request("r1"), 0).decision.kind).not.toBe("rejected");
    const queued = addAll(state, [request("r2"), request("r3")], 0);
    expect(ids(tick(queued, 20).batches).flat()).toEqual(["r2", "r3"]);
  });
});
