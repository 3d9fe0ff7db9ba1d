import { describe, expect, it } from "vitest";
import { BATCH_LANE } from "../../../../contracts/config/batching.ts";
import { onDispatched } from "../../../../durable-objects/batcher/window/events.ts";
import { tick } from "../../../../durable-objects/batcher/window/flush.ts";
import {
  batchLaneOpen,
  currentWindowMs,
  recordThreadLag,
} from "../../../../durable-objects/batcher/window/terms.ts";
import { createWindowState } from "../../../../durable-objects/batcher/window/state.ts";
import type { Batch, WindowState } from "../../../../durable-objects/batcher/window/types.ts";
import { windowConfig } from "../../../support/window-config.ts";
import { add, load, request } from "../../../support/window-state.ts";

// Three interactive lanes and the batch lane (3) below them; an engine of 8 slots whose
// origin runs at most 6 batch lines at once (it keeps 2 for interactive requests), and
// the batch lane sends ceil(8 * 0.25) = 2 more for the origin to hold ready.
const CAP = { background_cap: 6 };

function stateWithBatchLane(waitShare = 0): WindowState {
  const config = windowConfig({ maxOriginQueue: 8, waitShare, batchMaxLagMs: 20 });
  return createWindowState(
    { ...config, lanes: [...config.lanes, BATCH_LANE], batchLane: config.lanes.length },
    0,
  );
}

// Enqueues each request at `now`; the ids sent at once go into `sentNow`.
function queueAll(
  state: WindowState,
  ids: string[],
  lane: number,
  sentNow: string[] = [],
  now = 0,
) {
  let next = state;
  for (const id of ids) {
    const { state: after, decision } = add(next, request(id, { lane }), now);
    if (decision.kind === "dispatch-now") sentNow.push(...decision.batch.items.map((i) => i.id));
    next = after;
  }
  return next;
}

const sent = (batches: readonly Batch[]) => batches.flatMap((b) => b.items.map((i) => i.id));

describe("the batch lane", () => {
  it("sends lines for the running slots free beyond the reserve and a quarter more held ready at the origin, after every interactive request", () => {
    // 3 of 8 slots run: 5 free, 2 of them kept for interactive work, and 2 more lines
    // wait at the origin for the next slot that frees.
    let state = load(stateWithBatchLane(), "a", { running: 3, waiting: 0, ...CAP });
    const sentNow: string[] = [];
    state = queueAll(state, ["b1", "b2", "b3", "b4", "b5", "b6", "b7"], 3, sentNow);
    expect(sentNow).toEqual(["b1", "b2", "b3", "b4", "b5"]);
    state = queueAll(state, ["i1", "i2"], 0);
    // The interactive requests go; no batch line follows them.
    expect(sent(tick(state, 1000).batches)).toEqual(["i1", "i2"]);
  });

  it("counts the lines an origin runs or holds against the batch lane, and against no interactive request", () => {
    // 8 of 8 slots run, 6 of them batch lines, and the origin holds 2 more lines.
    let state = load(stateWithBatchLane(), "a", {
      running: 8,
      waiting: 0,
      background_running: 6,
      background_queued: 2,
      ...CAP,
    });
    state = queueAll(state, ["b1"], 3);
    const sentNow: string[] = [];
    state = queueAll(state, ["i1", "i2", "i3"], 0, sentNow);
    const { batches, state: after } = tick(state, 1000);
    // The origin stops batch lines for them: 6 slots are the interactive requests' to take.
    expect([...sentNow, ...sent(batches)]).toEqual(["i1", "i2", "i3"]);
    expect(after.lanes[3]?.map((item) => item.id)).toEqual(["b1"]);
  });

  it("sizes what it sends by the cap the origin reports, not by a share of its own", () => {
    // 3 of 8 slots run; an origin that keeps no reserve takes 5 lines into free slots and 2
    // to hold, one that keeps 4 slots takes 1 and 2 to hold.
    for (const [cap, expected] of [
      [8, ["b1", "b2", "b3", "b4", "b5", "b6", "b7"]],
      [4, ["b1", "b2", "b3"]],
    ] as const) {
      const state = load(stateWithBatchLane(), "a", {
        running: 3,
        waiting: 0,
        background_cap: cap,
      });
      const sentNow: string[] = [];
      const queued = queueAll(state, ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"], 3, sentNow);
      expect([...sentNow, ...sent(tick(queued, 1000).batches)]).toEqual(expected);
    }
  });

  it("sends one line to an idle origin that reports no cap, and none to a busy one", () => {
    const idle = load(stateWithBatchLane(), "a", { running: 0, waiting: 0 });
    const sentIdle: string[] = [];
    const idleQueued = queueAll(idle, ["b1", "b2"], 3, sentIdle);
    expect([...sentIdle, ...sent(tick(idleQueued, 500).batches)]).toEqual(["b1"]);
    const busy = load(stateWithBatchLane(), "a", { running: 3, waiting: 0 });
    const sentBusy: string[] = [];
    const busyQueued = queueAll(busy, ["b1"], 3, sentBusy);
    expect([...sentBusy, ...sent(tick(busyQueued, 500).batches)]).toEqual([]);
  });

  it("sends no batch line to an engine that queues, while interactive requests still go", () => {
    let state = load(stateWithBatchLane(), "a", { running: 8, waiting: 1, ...CAP });
    state = queueAll(state, ["b1"], 3);
    state = queueAll(state, ["i1"], 1);
    const { batches, state: after } = tick(state, 1000);
    expect(sent(batches)).toEqual(["i1"]);
    expect(after.lanes[3]?.map((item) => item.id)).toEqual(["b1"]);
  });

  it("leaves a batch line's wait for its first byte, its whole answer, out of the window interactive requests wait", () => {
    const sentNow: string[] = [];
    let state = load(stateWithBatchLane(0.5), "a", { running: 0, waiting: 0, ...CAP });
    state = queueAll(state, ["b1"], 3, sentNow);
    expect(sentNow).toEqual(["b1"]);
    state = onDispatched(state, "a", "b1", 400).state;
    expect(currentWindowMs(state, 400)).toBe(0);
    // An interactive request's wait counts.
    state = queueAll(state, ["i1"], 0, sentNow);
    state = onDispatched(state, "a", "i1", 400).state;
    expect(currentWindowMs(state, 400)).toBeGreaterThan(0);
  });
});

// Ten stalls of 50 ms at 900-990 ms: a mean lag of 50 ms, past the lane's 20.
function lagging(state: WindowState): WindowState {
  let next = state;
  for (let at = 900; at < 1000; at += 10) next = recordThreadLag(next, 50, at);
  return next;
}

const idle = () => load(stateWithBatchLane(), "a", { running: 0, waiting: 0, ...CAP });
// Enqueues at 1000 ms, after the stalls.
const queueAt = (state: WindowState, ids: string[], lane: number, sentNow: string[]) =>
  queueAll(state, ids, lane, sentNow, 1000);

describe("the batch lane while the Batcher's thread lags", () => {
  it("sends no line while interactive requests run, and sends them again once the stalls stop", () => {
    const sentNow: string[] = [];
    let state = queueAt(lagging(idle()), ["i1"], 0, sentNow);
    state = queueAt(state, ["b1", "b2"], 3, sentNow);
    expect(sentNow).toEqual(["i1"]);
    expect(batchLaneOpen(state, 1000)).toBe(false);
    const closed = tick(state, 1000);
    expect(sent(closed.batches)).toEqual([]);
    expect(closed.state.lanes[3]?.map((item) => item.id)).toEqual(["b1", "b2"]);
    // Nothing else may call it: the window looks again within one rate window.
    const { rateWindowMs } = closed.state.config;
    expect(closed.nextWakeAt).not.toBeNull();
    expect(closed.nextWakeAt ?? Infinity).toBeLessThanOrEqual(1000 + rateWindowMs);
    // With no stall for a few rate windows the mean is 0 again and the lines go.
    const later = 1000 + 5 * rateWindowMs;
    expect(batchLaneOpen(closed.state, later)).toBe(true);
    expect(sent(tick(closed.state, later).batches)).toEqual(["b1", "b2"]);
  });

  it("still sends interactive requests, ahead of the closed lane", () => {
    const sentNow: string[] = [];
    let state = queueAt(lagging(idle()), ["i1"], 0, sentNow);
    state = queueAt(state, ["b1"], 3, sentNow);
    state = queueAt(state, ["i2"], 1, sentNow);
    const { batches, state: after } = tick(state, 1000);
    expect([...sentNow, ...sent(batches)]).toEqual(["i1", "i2"]);
    expect(after.lanes[3]?.map((item) => item.id)).toEqual(["b1"]);
  });

  it("sends lines when no interactive request runs or waits: their own lag is nobody's wait", () => {
    const sentNow: string[] = [];
    const state = lagging(idle());
    expect(batchLaneOpen(state, 1000)).toBe(true);
    queueAt(state, ["b1"], 3, sentNow);
    expect(sentNow).toEqual(["b1"]);
  });

  it("is open below the lag it is set to", () => {
    let state = queueAt(idle(), ["i1"], 0, []);
    for (let at = 900; at < 1000; at += 10) state = recordThreadLag(state, 15, at);
    expect(batchLaneOpen(state, 1000)).toBe(true);
  });
});

describe("batch lines when no origin is usable", () => {
  it("refuses waiting lines as it refuses interactive requests: the run sends them again", () => {
    let state = load(stateWithBatchLane(), "a", { running: 8, waiting: 8, ...CAP });
    state = queueAll(state, ["line-1", "line-2"], 3);
    const result = tick(state, 10, { usable: () => false });
    expect(result.notices.map((n) => [n.kind, n.item.id])).toEqual([
      ["no-origin", "line-1"],
      ["no-origin", "line-2"],
    ]);
    expect(result.batches).toEqual([]);
  });
});
