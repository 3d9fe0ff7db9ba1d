import { describe, expect, it } from "vitest";
import { BATCH_LANE } from "../../../../contracts/config/batching.ts";
import { tick } from "../../../../durable-objects/batcher/window/flush.ts";
import { createWindowState } from "../../../../durable-objects/batcher/window/state.ts";
import type { Batch, WindowState } from "../../../../durable-objects/batcher/window/types.ts";
import { windowConfig } from "../../../support/window-config.ts";
import { add, load, request } from "../../../support/window-state.ts";

// Three interactive lanes and the batch lane (3) below them; an engine of 8 slots, of which
// the batch lane leaves ceil(8 * 0.25) = 2 free for interactive requests.
function stateWithBatchLane(): WindowState {
  const config = windowConfig({ maxOriginQueue: 8, batchReserveShare: 0.25 });
  return createWindowState(
    { ...config, lanes: [...config.lanes, BATCH_LANE], batchLane: config.lanes.length },
    0,
  );
}

// Enqueues each request; the ids sent at once go into `sentNow`.
function queueAll(state: WindowState, ids: string[], lane: number, sentNow: string[] = []) {
  let next = state;
  for (const id of ids) {
    const { state: after, decision } = add(next, request(id, { lane }), 0);
    if (decision.kind === "dispatch-now") sentNow.push(...decision.batch.items.map((i) => i.id));
    next = after;
  }
  return next;
}

const sent = (batches: readonly Batch[]) => batches.flatMap((b) => b.items.map((i) => i.id));

describe("the batch lane", () => {
  it("takes only the running slots left free beyond the reserve, after every interactive request", () => {
    // 3 of 8 slots run: 5 free, 2 of them kept for interactive work.
    let state = load(stateWithBatchLane(), "a", { running: 3, waiting: 0 });
    const sentNow: string[] = [];
    state = queueAll(state, ["b1", "b2", "b3", "b4", "b5"], 3, sentNow);
    // 5 - 2 = 3 batch lines start; the others wait in the batch lane.
    expect(sentNow).toEqual(["b1", "b2", "b3"]);
    state = queueAll(state, ["i1", "i2"], 0);
    // The interactive requests take the reserve; no batch line follows them.
    expect(sent(tick(state, 1000).batches)).toEqual(["i1", "i2"]);
  });

  it("sends no batch line to an engine that queues, while interactive requests still go", () => {
    let state = load(stateWithBatchLane(), "a", { running: 8, waiting: 1 });
    state = queueAll(state, ["b1"], 3);
    state = queueAll(state, ["i1"], 1);
    const { batches, state: after } = tick(state, 1000);
    expect(sent(batches)).toEqual(["i1"]);
    expect(after.lanes[3]?.map((item) => item.id)).toEqual(["b1"]);
  });
});
