import { describe, expect, it } from "vitest";
import { type WindowConfigInput, windowConfig } from "../../../support/window-config.ts";
import { onDispatched, onItemDone } from "../../../../durable-objects/batcher/window/events.ts";
import { tick } from "../../../../durable-objects/batcher/window/flush.ts";
import {
  currentWindowMs,
  meanThreadLagMs,
  recordFirstByteWait,
  recordThreadLag,
  tokenHoldMs,
  MIN_HOLD_MS,
} from "../../../../durable-objects/batcher/window/terms.ts";
import type { Batch, WindowState } from "../../../../durable-objects/batcher/window/types.ts";
import {
  stateWith,
  request,
  load,
  saturated,
  add,
  ids,
  expectQueued,
} from "../../../support/window-state.ts";

/**
 * Drives one origin with free slots at `arrivalsPerMs`, finishing every item 1 ms after
 * it was sent, and returns the calls made and the longest wait of any request.
 */
function drive(input: Partial<WindowConfigInput>, gapMs: number, durationMs: number) {
  let state = load(stateWith(input), "a", { max_num_seqs: 1024 });
  const arrivedAt = new Map<string, number>();
  const batches: Batch[] = [];
  let wake: number | null = null;
  let longestWait = 0;
  const sent = (batch: Batch, now: number) => {
    batches.push(batch);
    for (const item of batch.items) {
      longestWait = Math.max(longestWait, now - (arrivedAt.get(item.id) ?? now));
    }
  };
  const finishBefore = (now: number) => {
    for (const item of state.origins[0]?.inFlight ?? []) {
      if (item.sentAt + 1 <= now) state = onItemDone(state, "a", item.id, now).state;
    }
  };
  const runTick = (now: number) => {
    const result = tick(state, now);
    state = result.state;
    for (const batch of result.batches) sent(batch, now);
    wake = result.nextWakeAt;
  };
  let n = 0;
  for (let now = 0; now < durationMs; now += gapMs) {
    for (;;) {
      const due: number | null = wake;
      if (due === null || due > now) break;
      runTick(due);
    }
    finishBefore(now);
    const id = `r${n++}`;
    arrivedAt.set(id, now);
    const step = add(state, request(id), now);
    state = step.state;
    if (step.decision.kind === "dispatch-now") sent(step.decision.batch, now);
    if (step.decision.kind === "queued") runTick(now);
  }
  for (;;) {
    const due: number | null = wake;
    if (due === null) break;
    runTick(due);
  }
  return { requests: n, calls: batches.length, longestWait, state };
}

/** The window at a steady `perMs` arrival rate, for engines with slots to spare. */
function windowAt(perMs: number, origins = 1, maxWindowMs = 10): number {
  const originIds = Array.from({ length: origins }, (_, i) => ({ id: `o${i}` }));
  let state = stateWith({ callIntervalMs: 5, maxWindowMs, rateWindowMs: 100, origins: originIds });
  // Free slots aplenty: the overload term stays 0, only the call term acts.
  for (const { id } of originIds) state = load(state, id, { max_num_seqs: 1_000_000 });
  // A decayed count of `perMs * rateWindowMs` arrivals is a rate of `perMs`.
  return currentWindowMs({ ...state, arrivals: { value: perMs * 100, at: 0 } }, 0);
}

/** The call term at `perMs` arrivals for an origin that reports `stepMs`. */
function windowWithStep(stepMs: number, callIntervalMs = 5, perMs = 0.25): number {
  let state = stateWith({ callIntervalMs, maxWindowMs: 100, rateWindowMs: 100 });
  state = load(state, "a", { max_num_seqs: 1_000_000, step_ms: stepMs });
  return currentWindowMs({ ...state, arrivals: { value: perMs * 100, at: 0 } }, 0);
}

describe("call term", () => {
  it("collapses a steady stream into calls at the useful rate while the engine has free slots", () => {
    const { requests, calls, longestWait } = drive(
      { callIntervalMs: 5, maxWindowMs: 10, rateWindowMs: 100 },
      0.25,
      2000,
    );
    // Four arrivals per ms against one useful call per 5 ms: about 20 requests per call.
    expect(requests).toBe(8000);
    expect(calls).toBeLessThanOrEqual(requests / 8);
    expect(longestWait).toBeLessThanOrEqual(10);
  });

  it("gives every request its own call while arrivals stay under one per interval", () => {
    const { requests, calls, longestWait } = drive(
      { callIntervalMs: 5, maxWindowMs: 10, rateWindowMs: 100 },
      10,
      2000,
    );
    expect(calls).toBe(requests);
    expect(longestWait).toBe(0);
  });

  it("rises from 0 at one arrival per interval per origin, bounded by maxWindowMs", () => {
    expect(windowAt(0.1)).toBe(0);
    expect(windowAt(0.2)).toBe(0);
    expect(windowAt(0.25)).toBeCloseTo(1, 6);
    expect(windowAt(1)).toBeCloseTo(4, 6);
    expect(windowAt(100)).toBeCloseTo(4.99, 6);
    expect(windowAt(100, 1, 3)).toBe(3);
    // Two healthy origins take calls twice as often.
    expect(windowAt(0.4, 2)).toBe(0);
    expect(windowAt(1, 2)).toBeCloseTo(1.5, 6);
  });

  it("calls an origin at most once per engine step when its reports carry a longer one", () => {
    // One call per 20 ms step against four arrivals per ms: 20 - 4 ms.
    expect(windowWithStep(20)).toBeCloseTo(16, 6);
    expect(windowWithStep(20, 5, 0.04)).toBe(0);
    // A step shorter than callIntervalMs, or none reported, leaves callIntervalMs.
    expect(windowWithStep(2)).toBeCloseTo(1, 6);
    expect(windowWithStep(0)).toBeCloseTo(1, 6);
    expect(windowWithStep(Number.NaN)).toBeCloseTo(1, 6);
    // callIntervalMs 0 still turns the term off.
    expect(windowWithStep(20, 0)).toBe(0);
  });

  it("is off with callIntervalMs 0", () => {
    const state = load(stateWith({ callIntervalMs: 0, rateWindowMs: 100 }), "a", {
      max_num_seqs: 1_000_000,
    });
    expect(currentWindowMs({ ...state, arrivals: { value: 1000, at: 0 } }, 0)).toBe(0);
  });

  it("still sends a lone request at once when its origin is idle, whatever the arrival rate", () => {
    const state = load(stateWith({ callIntervalMs: 5, rateWindowMs: 100 }), "a", {});
    const busy = { ...state, arrivals: { value: 1000, at: 0 } };
    expect(currentWindowMs(busy, 0)).toBeGreaterThan(0);
    expect(add(busy, request("r1"), 0).decision.kind).toBe("dispatch-now");
  });

  it("holds a request that arrives while its origin is busy and calls are at their rate", () => {
    let state = load(stateWith({ callIntervalMs: 5, rateWindowMs: 100 }), "a", {});
    state = { ...state, arrivals: { value: 1000, at: 0 } };
    state = add(state, request("r1"), 0).state;
    const second = add(state, request("r2"), 0);
    const queued = expectQueued(second.decision);
    expect(queued.windowMs).toBeGreaterThan(0);
    expect(queued.flushAt).toBeCloseTo(queued.windowMs, 6);
  });
});

describe("wait term", () => {
  it("holds a request for a share of the recent wait for a first byte, within maxWindowMs", () => {
    const input = { callIntervalMs: 0, maxWindowMs: 50, waitShare: 0.1, rateWindowMs: 1000 };
    let state = load(stateWith(input), "a", { max_num_seqs: 1000 });
    state = add(state, request("r1"), 0).state;
    // Nothing has come back yet: no wait to go by, the window stays closed.
    expect(currentWindowMs(state, 100)).toBe(0);
    state = onDispatched(state, "a", "r1", 200).state;
    expect(currentWindowMs(state, 200)).toBeCloseTo(20, 6);
    const second = add(state, request("r2"), 200);
    const queued = expectQueued(second.decision);
    expect(queued.windowMs).toBeCloseTo(20, 6);
    expect(queued.flushAt).toBeCloseTo(220, 6);
    // A first byte is counted once, however often it is reported.
    state = onDispatched(second.state, "a", "r1", 300).state;
    expect(currentWindowMs(state, 200)).toBeCloseTo(20, 6);
  });

  it("counts the wait from arrival, so time in the queue counts too", () => {
    let state = saturated({ callIntervalMs: 0, maxWindowMs: 1000, waitShare: 0.5 });
    const queued = add(state, request("r1", { enqueuedAt: 0 }), 100);
    const { flushAt } = expectQueued(queued.decision);
    const sent = tick(queued.state, flushAt);
    expect(sent.batches.map(ids)).toEqual([["r1"]]);
    state = onDispatched(sent.state, "a", "r1", flushAt + 100).state;
    // An idle origin again: only the wait term is left, half the wait from arrival.
    state = load(state, "a", {}, flushAt + 100);
    expect(currentWindowMs(state, flushAt + 100)).toBeCloseTo((flushAt + 100) / 2, 6);
  });

  it("weighs the waits callers report, and counts a reported item only once", () => {
    const input = { callIntervalMs: 0, maxWindowMs: 50, waitShare: 0.1, rateWindowMs: 1000 };
    let state = load(stateWith(input), "a", { max_num_seqs: 1000 });
    state = add(state, request("r1"), 0).state;
    state = onDispatched(state, "a", "r1", 200, { countWait: false }).state;
    expect(currentWindowMs(state, 200)).toBe(0);
    state = recordFirstByteWait(state, 300, 200);
    expect(currentWindowMs(state, 200)).toBeCloseTo(30, 6);
    expect(recordFirstByteWait(state, Number.NaN, 200)).toBe(state);
  });

  it("weighs how late the batcher's thread runs, when that is longer than first-byte waits", () => {
    const input = { callIntervalMs: 0, maxWindowMs: 50, waitShare: 0.1, rateWindowMs: 1000 };
    let state = load(stateWith(input), "a", { max_num_seqs: 1000 });
    // Nothing measured yet: no lag.
    expect(meanThreadLagMs(state, 0)).toBe(0);
    state = recordThreadLag(state, 200, 0);
    state = recordThreadLag(state, 400, 0);
    expect(meanThreadLagMs(state, 0)).toBeCloseTo(300, 6);
    expect(currentWindowMs(state, 0)).toBeCloseTo(30, 6);
    // Longer first-byte waits win; a shorter one leaves the lag's share in place.
    state = recordFirstByteWait(state, 100, 0);
    expect(currentWindowMs(state, 0)).toBeCloseTo(30, 6);
    state = recordFirstByteWait(state, 700, 0);
    expect(currentWindowMs(state, 0)).toBeCloseTo(40, 6);
    expect(recordThreadLag(state, -1, 0)).toBe(state);
    expect(recordThreadLag(state, Number.POSITIVE_INFINITY, 0)).toBe(state);
  });

  it("lets the thread's lag fade once it is no longer measured, and caps it at maxWindowMs", () => {
    const base = { callIntervalMs: 0, maxWindowMs: 10, rateWindowMs: 100 };
    let state = load(stateWith(base), "a", { max_num_seqs: 1000 });
    state = recordThreadLag(state, 1000, 1000);
    expect(currentWindowMs(state, 1000)).toBe(10);
    expect(meanThreadLagMs(state, 1500)).toBe(0);
    expect(currentWindowMs(state, 1500)).toBe(0);
    let off = load(stateWith({ ...base, waitShare: 0 }), "a", { max_num_seqs: 1000 });
    off = recordThreadLag(off, 1000, 1000);
    expect(currentWindowMs(off, 1000)).toBe(0);
  });

  it("is bounded by maxWindowMs, fades as first bytes stop, and is off with waitShare 0", () => {
    const base = { callIntervalMs: 0, maxWindowMs: 10, rateWindowMs: 100 };
    let state = load(stateWith(base), "a", { max_num_seqs: 1000 });
    state = add(state, request("r1"), 0).state;
    state = onDispatched(state, "a", "r1", 1000).state;
    expect(currentWindowMs(state, 1000)).toBe(10);
    expect(currentWindowMs(state, 1500)).toBe(0);
    let off = load(stateWith({ ...base, waitShare: 0 }), "a", { max_num_seqs: 1000 });
    off = add(off, request("r1"), 0).state;
    off = onDispatched(off, "a", "r1", 1000).state;
    expect(currentWindowMs(off, 1000)).toBe(0);
  });
});

/** A state whose thread lagged `lagMs` once, at 1000. */
function lagged(input: Partial<WindowConfigInput>, lagMs: number): WindowState {
  return recordThreadLag(
    stateWith({ rateWindowMs: 100, holdMinInFlight: 0, ...input }),
    lagMs,
    1000,
  );
}

/** `state` with `count` items running on its origin "a". */
function running(state: WindowState, count: number): WindowState {
  let next = state;
  for (let i = 0; i < count; i++) next = add(next, request(`run-${i}`), 1000).state;
  return next;
}

describe("holding streamed tokens", () => {
  it("holds nothing until the thread lags, then holdShare of its lag, at most maxHoldMs", () => {
    let state = stateWith({
      holdShare: 0.5,
      maxHoldMs: 10,
      rateWindowMs: 1000,
      holdMinInFlight: 0,
    });
    expect(tokenHoldMs(state, 0)).toBe(0);
    state = recordThreadLag(state, 4, 0);
    state = recordThreadLag(state, 8, 0);
    expect(tokenHoldMs(state, 0)).toBeCloseTo(3, 6);
    state = recordThreadLag(state, 300, 0);
    expect(tokenHoldMs(state, 0)).toBe(10);
  });

  it("holds nothing below MIN_HOLD_MS, once the lag fades, or with holdShare 0", () => {
    // Half of 1.5 ms: below the shortest hold worth a timer.
    expect(tokenHoldMs(lagged({ holdShare: 0.5 }, 1.5), 1000)).toBe(0);
    expect(tokenHoldMs(lagged({ holdShare: 0.5 }, 2 * MIN_HOLD_MS), 1000)).toBe(MIN_HOLD_MS);
    expect(tokenHoldMs(lagged({ holdShare: 0.5 }, 20), 1500)).toBe(0);
    expect(tokenHoldMs(lagged({ holdShare: 0 }, 200), 1000)).toBe(0);
    expect(tokenHoldMs(lagged({ holdShare: 1, maxHoldMs: 0 }, 200), 1000)).toBe(0);
  });

  it("holds nothing while fewer items run than holdMinInFlight, however the thread lags", () => {
    // No wait term: each request leaves at once and runs.
    const state = lagged({ holdShare: 1, maxHoldMs: 10, holdMinInFlight: 3, waitShare: 0 }, 8);
    expect(tokenHoldMs(running(state, 2), 1000)).toBe(0);
    expect(tokenHoldMs(running(state, 3), 1000)).toBeCloseTo(8, 6);
  });

  it("defaults to the whole lag, at most 10 ms, and only from 128 items running at once", () => {
    const config = windowConfig();
    expect([config.holdShare, config.maxHoldMs, config.holdMinInFlight]).toEqual([1, 10, 128]);
  });
});
