import { describe, expect, it } from "vitest";
import {
  chooseLeastLoaded,
  type OriginChooser,
} from "../../../../durable-objects/batcher/window/origin-choice.ts";
import {
  cancel,
  onDispatched,
  onItemDone,
  onOriginLoad,
} from "../../../../durable-objects/batcher/window/events.ts";
import { enqueue, tick } from "../../../../durable-objects/batcher/window/flush.ts";
import { healthyCandidates } from "../../../../durable-objects/batcher/window/terms.ts";
import {
  stateWith,
  report,
  request,
  load,
  saturated,
  add,
  without,
  ids,
} from "../../../support/window-state.ts";

describe("in-flight accounting and cancellation", () => {
  it("cancels a waiting request so it never reaches an origin", () => {
    let state = saturated();
    state = add(state, request("r1"), 0).state;
    state = add(state, request("r2"), 0).state;
    const cancelled = cancel(state, "r1", 1);
    expect(cancelled.outcome.kind === "removed" && cancelled.outcome.item.id).toBe("r1");
    expect(tick(cancelled.state, 10).batches.map(ids)).toEqual([["r2"]]);
    expect(cancel(cancelled.state, "r1", 2).outcome).toEqual({ kind: "not-found" });
  });

  it("tells the shell where to cancel a running request, once", () => {
    const sent = add(stateWith(), request("r1"), 0);
    const first = cancel(sent.state, "r1", 1);
    expect(first.outcome).toEqual({
      kind: "cancel-in-flight",
      originId: "a",
      batchSeq: 1,
      itemId: "r1",
    });
    expect(cancel(first.state, "r1", 2).outcome).toEqual({
      kind: "already-cancelling",
      originId: "a",
      batchSeq: 1,
    });
    const done = onItemDone(first.state, "a", "r1", 3);
    expect(done.outcome.kind).toBe("updated");
    expect(cancel(done.state, "r1", 4).outcome).toEqual({ kind: "not-found" });
  });

  it("keeps several batches in flight to one origin and accounts each item", () => {
    let state = saturated({ maxBatchSize: 2 });
    for (const id of ["r1", "r2", "r3", "r4"]) state = add(state, request(id), 0).state;
    const first = tick(state, 0);
    expect(first.batches.map((b) => [b.seq, b.originId, ids(b)])).toEqual([
      [1, "a", ["r1", "r2"]],
      [2, "a", ["r3", "r4"]],
    ]);
    state = add(first.state, request("r5"), 1).state;
    state = add(state, request("r6"), 1).state;
    const second = tick(state, 1);
    expect(second.batches.map((b) => [b.seq, ids(b)])).toEqual([[3, ["r5", "r6"]]]);
    state = onItemDone(second.state, "a", "r3", 2).state;
    expect(state.origins[0]?.inFlight.map((i) => [i.id, i.batchSeq])).toEqual([
      ["r1", 1],
      ["r2", 1],
      ["r4", 2],
      ["r5", 3],
      ["r6", 3],
    ]);
    expect(onItemDone(state, "a", "r3", 3).outcome).toEqual({ kind: "not-found" });
    expect(onItemDone(state, "b", "r1", 3).outcome).toEqual({ kind: "not-found" });
  });

  it("records when the origin acknowledges an item", () => {
    const sent = add(stateWith(), request("r1"), 0);
    const started = onDispatched(sent.state, "a", "r1", 4);
    expect(started.outcome.kind === "updated" && started.outcome.item.startedAt).toBe(4);
    expect(onDispatched(sent.state, "a", "nope", 4).outcome).toEqual({ kind: "not-found" });
  });

  it("refuses a second request with an id already queued or in flight", () => {
    const sent = add(stateWith(), request("r1"), 0);
    expect(add(sent.state, request("r1"), 1).decision).toEqual({
      kind: "rejected",
      reason: "duplicate_id",
    });
  });
});

const byTarget: OriginChooser = (candidates, head) => head.target ?? candidates[0]?.id ?? null;
const alwaysB: OriginChooser = (candidates) => candidates.find((c) => c.id === "b")?.id ?? null;

describe("origin choice and health", () => {
  it("sends to the least loaded origin by reported and in-flight sequences", () => {
    let state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    state = load(state, "a", { running: 4 });
    state = load(state, "b", { running: 2 });
    const r1 = add(state, request("r1"), 0);
    expect(r1.decision.kind === "dispatch-now" && r1.decision.batch.originId).toBe("b");
    const r2 = add(r1.state, request("r2"), 0);
    expect(r2.decision.kind === "dispatch-now" && r2.decision.batch.originId).toBe("b");
    const r3 = add(r2.state, request("r3"), 0);
    // b now runs 2 + 2 of ours; a still 4: the tie goes to configuration order.
    expect(r3.decision.kind === "dispatch-now" && r3.decision.batch.originId).toBe("a");
  });

  it("skips an origin the health rule says may take nothing, and uses it once it may", () => {
    const state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    const down = add(state, request("r1"), 0, without("a"));
    expect(down.decision.kind === "dispatch-now" && down.decision.batch.originId).toBe("b");
    const back = add(down.state, request("r2"), 100);
    expect(back.decision.kind === "dispatch-now" && back.decision.batch.originId).toBe("a");
    expect(onOriginLoad(state, "zz", report(), 5).outcome).toEqual({ kind: "unknown-origin" });
  });

  it("takes a replacement origin chooser", () => {
    const state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    const { decision } = enqueue(state, request("r1"), 0, { chooseOrigin: alwaysB });
    expect(decision.kind === "dispatch-now" && decision.batch.originId).toBe("b");
  });

  it("fills each origin's batch with the requests the router placed on it", () => {
    let state = stateWith({ origins: [{ id: "a" }, { id: "b" }], maxWindowMs: 5 });
    state = load(load(state, "a", { running: 8, waiting: 1 }), "b", { running: 8, waiting: 1 });
    for (const [id, target] of [
      ["r1", "a"],
      ["r2", "b"],
      ["r3", "a"],
    ] as const) {
      state = enqueue(state, request(id, { target }), 0, { chooseOrigin: byTarget }).state;
    }
    const split = tick(state, 1_000, { chooseOrigin: byTarget });
    expect(split.batches.map((b) => [b.originId, ids(b)])).toEqual([
      ["a", ["r1", "r3"]],
      ["b", ["r2"]],
    ]);
    // An origin that is down holds nobody back: its requests join another's batch.
    const joined = tick(state, 1_000, { chooseOrigin: byTarget, ...without("b") });
    expect(joined.batches.map((b) => [b.originId, ids(b)])).toEqual([["a", ["r1", "r2", "r3"]]]);
  });

  it("reports its candidates the way the chooser sees them", () => {
    let state = load(stateWith(), "a", { running: 3, max_num_seqs: 8, kv_free_blocks: 4 });
    state = add(state, request("r1", { promptTokens: 10 }), 0).state;
    expect(healthyCandidates(state, 1)).toEqual([
      {
        id: "a",
        load: 4,
        freeSlots: 4,
        room: 4100,
        kvRoomTokens: 54,
        inFlight: 1,
        engine: {
          maxNumSeqs: 8,
          stepMs: 0,
          prefillTokensPerMs: null,
          prefillBacklogTokens: null,
          reportedAt: 0,
          batchLoad: 4,
          backgroundCap: null,
        },
      },
    ]);
    expect(
      chooseLeastLoaded(healthyCandidates(state, 1), { id: "x", lane: 0, promptTokens: 55 }),
    ).toBeNull();
  });
});
