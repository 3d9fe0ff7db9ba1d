import { describe, expect, it } from "vitest";
import type { LoadReport } from "../../../contracts/protocol.ts";
import { chooseLeastLoaded } from "../../../durable-objects/batcher/origin-choice.ts";
import type { OriginChooser } from "../../../durable-objects/batcher/origin-choice.ts";
import {
  cancel,
  createWindowState,
  currentWindowMs,
  enqueue,
  healthyCandidates,
  meanThreadLagMs,
  MIN_RETRY_AFTER_MS,
  onDispatched,
  onItemDone,
  onOriginLoad,
  queuedCount,
  recordFirstByteWait,
  recordThreadLag,
  tokenHoldMs,
  MIN_HOLD_MS,
  tick,
} from "../../../durable-objects/batcher/window/index.ts";
import { z } from "zod";
import { mulberry32 } from "../../../origin/faults.ts";
import { BATCHING_FIELDS } from "../../../durable-objects/batcher/settings.ts";
import { MAX_BATCH_ITEMS } from "../../../contracts/protocol.ts";
import { type WindowConfigInput, windowConfig } from "../../support/window-config.ts";
import type {
  Batch,
  EnqueueDecision,
  WindowOptions,
  WindowRequest,
  WindowState,
} from "../../../durable-objects/batcher/window/index.ts";

// Origins here may queue without bound: holding for them is backpressure.test.ts's subject.
function stateWith(input: Partial<WindowConfigInput> = {}, now = 0): WindowState {
  return createWindowState(windowConfig({ maxOriginQueue: 4096, ...input }), now);
}

function report(over: Partial<LoadReport> = {}): LoadReport {
  return {
    origin: "a",
    t: 0,
    running: 0,
    waiting: 0,
    kv_usage: 0,
    kv_free_blocks: 1000,
    kv_total_blocks: 1000,
    block_size: 16,
    prefix_queries: 0,
    prefix_hits: 0,
    max_num_seqs: 8,
    ...over,
  };
}

function request(id: string, over: Partial<WindowRequest> = {}): WindowRequest {
  return { id, lane: 0, promptTokens: 100, maxTokens: 100, ...over };
}

function load(state: WindowState, originId: string, over: Partial<LoadReport>, now = 0) {
  return onOriginLoad(state, originId, report({ origin: originId, ...over }), now).state;
}

/** An origin whose engine is full and queueing: every new request has to wait anyway. */
function saturated(input: Partial<WindowConfigInput> = {}): WindowState {
  return load(stateWith(input), "a", { running: 8, waiting: 2 });
}

function add(state: WindowState, req: WindowRequest, now: number, options: WindowOptions = {}) {
  return enqueue(state, req, now, options);
}

/** The health rule says these origins may take nothing (their breakers are open). */
function without(...down: string[]): WindowOptions {
  return { usable: (id) => !down.includes(id) };
}

function ids(batch: Batch): string[] {
  return batch.items.map((item) => item.id);
}

/** What an origin could take before a step: prompt tokens and sequences (null: unknown). */
interface Room {
  kv: number | null;
  seqs: number | null;
}

function expectQueued(decision: EnqueueDecision): { flushAt: number; windowMs: number } {
  if (decision.kind !== "queued") throw new Error(`expected queued, got ${decision.kind}`);
  return decision;
}

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
    const schema = z.strictObject(BATCHING_FIELDS);
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
  return recordThreadLag(stateWith({ rateWindowMs: 100, ...input }), lagMs, 1000);
}

describe("holding streamed tokens", () => {
  it("holds nothing until the thread lags, then holdShare of its lag, at most maxHoldMs", () => {
    let state = stateWith({ holdShare: 0.5, maxHoldMs: 10, rateWindowMs: 1000 });
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

  it("defaults to the whole lag, at most 10 ms", () => {
    const config = windowConfig();
    expect([config.holdShare, config.maxHoldMs]).toEqual([1, 10]);
  });
});

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

  it("passes over a request that avoids the only healthy origin without holding up the rest", () => {
    let state = stateWith({ origins: [{ id: "a" }, { id: "b" }] });
    const bDown = without("b");
    state = load(state, "a", { running: 8, waiting: 2 });
    state = add(state, request("r1", { avoidOrigins: ["a"] }), 0, bDown).state;
    state = add(state, request("r2"), 0, bDown).state;
    state = add(state, request("r3"), 0, bDown).state;
    const first = tick(state, 10, bDown);
    expect(first.batches.map((b) => [b.originId, ids(b)])).toEqual([["a", ["r2", "r3"]]]);
    expect(queuedCount(first.state)).toBe(1);
    // b's breaker closes: the next tick sends what waited for it.
    const back = tick(first.state, 100);
    expect(back.batches.map((b) => [b.originId, ids(b)])).toEqual([["b", ["r1"]]]);
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
    let state = stateWith({
      lanes: [
        { queueTimeoutMs: 100, onTimeout: "reject" },
        { queueTimeoutMs: 100, onTimeout: "wait" },
      ],
    });
    const aDown = without("a");
    state = add(state, request("x", { lane: 0 }), 0, aDown).state;
    state = add(state, request("y", { lane: 1 }), 0, aDown).state;
    const blocked = tick(state, 10, aDown);
    expect(blocked.batches).toEqual([]);
    expect(blocked.nextWakeAt).toBe(100);

    const timeout = tick(blocked.state, 100, aDown);
    expect(timeout.notices.map((n) => [n.kind, n.item.id])).toEqual([
      ["timed-out", "x"],
      ["overdue", "y"],
    ]);
    // Nothing to wake for: the origin's return is an event that ticks the window.
    expect(timeout.nextWakeAt).toBeNull();
    expect(tick(timeout.state, 500, aDown).notices).toEqual([]);

    const back = tick(timeout.state, 1000);
    expect(back.batches.map(ids)).toEqual([["y"]]);
  });

  it("lets a caller's own deadline end the wait before the lane's timeout", () => {
    const state = add(stateWith(), request("x", { deadline: 50 }), 0, without("a")).state;
    expect(tick(state, 50, without("a")).notices.map((n) => n.kind)).toEqual(["timed-out"]);
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
        },
      },
    ]);
    expect(
      chooseLeastLoaded(healthyCandidates(state, 1), { id: "x", lane: 0, promptTokens: 55 }),
    ).toBeNull();
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

describe("no request is lost or duplicated", () => {
  for (let seed = 1; seed <= 20; seed++) {
    it(`settles every id exactly once under random arrivals (seed ${seed})`, () => {
      const random = mulberry32(seed);
      const pick = <T>(values: readonly T[]): T => {
        const value = values[Math.floor(random() * values.length)];
        if (value === undefined) throw new Error("empty choice");
        return value;
      };
      const origins = ["a", "b", "c"];
      const config = windowConfig({
        maxBatchSize: 1 + Math.floor(random() * 8),
        maxBatchTokens: 500 + Math.floor(random() * 3000),
        maxWindowMs: Math.floor(random() * 20),
        rateWindowMs: 20 + random() * 200,
        loadReportTtlMs: 50 + Math.floor(random() * 500),
        maxOriginQueue: 1 + Math.floor(random() * 16),
        lanes: [0, 1, 2].map(() => ({
          queueTimeoutMs: 20 + Math.floor(random() * 400),
          onTimeout: pick(["reject", "wait"] as const),
          maxQueue: 2 + Math.floor(random() * 20),
        })),
        origins: origins.map((id) => ({ id })),
      });
      let state = createWindowState(config, 0);
      let now = 0;
      let nextId = 0;
      const enqueueOrder = new Map<string, number>();
      const fates = new Map<string, string[]>();
      const violations: string[] = [];
      const check = (ok: boolean, message: string): void => {
        if (!ok) violations.push(message);
      };
      const settle = (id: string, fate: string): void => {
        fates.set(id, [...(fates.get(id) ?? []), fate]);
      };
      const inFlight = (): Array<[string, string]> =>
        state.origins.flatMap((o) => o.inFlight.map((i): [string, string] => [o.id, i.id]));

      const checkBatches = (batches: readonly Batch[], roomBefore: Map<string, Room>) => {
        const used = new Map<string, number>();
        const seqs = new Map<string, number>();
        for (const batch of batches) {
          expect(batch.items.length).toBeGreaterThan(0);
          expect(batch.items.length).toBeLessThanOrEqual(config.maxBatchSize);
          const tokens = batch.items.reduce((sum, i) => sum + i.promptTokens + i.maxTokens, 0);
          check(
            batch.items.length === 1 || tokens <= config.maxBatchTokens,
            `batch ${batch.seq} holds ${tokens} tokens`,
          );
          // Lane order, FIFO within a lane.
          for (let i = 1; i < batch.items.length; i++) {
            const prev = batch.items[i - 1];
            const item = batch.items[i];
            if (prev === undefined || item === undefined) throw new Error("gap in batch");
            check(prev.lane <= item.lane, `batch ${batch.seq}: ${item.id} overtook a lower lane`);
            check(
              prev.lane !== item.lane ||
                (enqueueOrder.get(prev.id) ?? 0) < (enqueueOrder.get(item.id) ?? 0),
              `batch ${batch.seq}: ${item.id} overtook ${prev.id} in lane ${item.lane}`,
            );
          }
          // Never more prompt tokens than the origin's report said it could hold.
          const room = roomBefore.get(batch.originId);
          const sent =
            (used.get(batch.originId) ?? 0) + batch.items.reduce((s, i) => s + i.promptTokens, 0);
          used.set(batch.originId, sent);
          check(roomBefore.has(batch.originId), `batch ${batch.seq} went to an unhealthy origin`);
          check(room?.kv == null || sent <= room.kv, `${sent} tokens over KV room`);
          // Never more sequences than its engine may queue beyond its slots.
          const count = (seqs.get(batch.originId) ?? 0) + batch.items.length;
          seqs.set(batch.originId, count);
          check(room?.seqs == null || count <= room.seqs, `${count} sequences over room`);
          for (const item of batch.items) settle(item.id, "batch");
        }
      };
      // The health rule's verdicts, as the shell would pass them: down until a time.
      const downUntil = new Map<string, number>();
      const health: WindowOptions = { usable: (id) => (downUntil.get(id) ?? 0) <= now };
      const rooms = (): Map<string, Room> =>
        new Map(
          healthyCandidates(state, now, health.usable).map((c) => [
            c.id,
            { kv: c.kvRoomTokens, seqs: c.room },
          ]),
        );

      for (let step = 0; step < 500; step++) {
        now += random() < 0.3 ? 0 : random() * 8;
        const op = random();
        if (op < 0.4) {
          const id = `r${nextId++}`;
          enqueueOrder.set(id, nextId);
          const roomBefore = rooms();
          const result = enqueue(
            state,
            {
              id,
              lane: Math.floor(random() * 3),
              promptTokens: random() < 0.05 ? 3000 : 1 + Math.floor(random() * 400),
              maxTokens: Math.floor(random() * 300),
              ...(random() < 0.2 ? { deadline: now + random() * 300 } : {}),
            },
            now,
            health,
          );
          state = result.state;
          const decision = result.decision;
          switch (decision.kind) {
            case "dispatch-now":
              checkBatches([decision.batch], roomBefore);
              break;
            case "queued":
              check(decision.windowMs <= config.maxWindowMs, `window ${decision.windowMs}`);
              break;
            case "rejected":
              settle(id, `rejected:${decision.reason}`);
              break;
          }
        } else if (op < 0.47) {
          // A retried id that is still queued or running is refused, never admitted twice.
          const known = [...state.lanes.flat().map((i) => i.id), ...inFlight().map(([, id]) => id)];
          if (known.length > 0) {
            const result = enqueue(state, request(pick(known)), now, health);
            check(
              result.decision.kind === "rejected" &&
                result.decision.reason === "duplicate_id" &&
                result.state === state,
              `a known id was admitted again at step ${step}`,
            );
          }
        } else if (op < 0.67) {
          const roomBefore = rooms();
          const result = tick(state, now, health);
          state = result.state;
          checkBatches(result.batches, roomBefore);
          for (const notice of result.notices) {
            switch (notice.kind) {
              case "timed-out":
              case "too-large":
                settle(notice.item.id, notice.kind);
                break;
              case "overdue":
                break;
            }
          }
          check(result.nextWakeAt === null || result.nextWakeAt > now, "wake in the past");
        } else if (op < 0.77) {
          state = onOriginLoad(
            state,
            pick(origins),
            report({
              running: Math.floor(random() * 10),
              waiting: Math.floor(random() * 3),
              max_num_seqs: 8,
              kv_free_blocks: Math.floor(random() * 60),
              kv_total_blocks: 100 + Math.floor(random() * 100),
            }),
            now,
          ).state;
        } else if (op < 0.87) {
          const running = inFlight();
          if (running.length > 0) {
            const [originId, itemId] = pick(running);
            if (random() < 0.3) state = onDispatched(state, originId, itemId, now).state;
            else state = onItemDone(state, originId, itemId, now).state;
          }
        } else if (op < 0.96 && nextId > 0) {
          const id = `r${Math.floor(random() * nextId)}`;
          const result = cancel(state, id, now);
          state = result.state;
          if (result.outcome.kind === "removed") settle(id, "cancelled");
        } else {
          downUntil.set(pick(origins), now + random() * 200);
        }

        // The shell persists state as JSON and may rebuild it at any step.
        state = JSON.parse(JSON.stringify(state)) as WindowState;
        const queued = state.lanes.flat().map((i) => i.id);
        const running = inFlight().map(([, id]) => id);
        expect(new Set([...queued, ...running]).size).toBe(queued.length + running.length);
        for (const [lane, queue] of state.lanes.entries()) {
          expect(queue.length).toBeLessThanOrEqual(config.lanes[lane]?.maxQueue ?? 0);
        }
      }

      // Load falls away: every origin is healthy with room to spare, and time moves on.
      for (const id of origins) {
        downUntil.delete(id);
        state = onOriginLoad(
          state,
          id,
          report({ kv_free_blocks: 1000, kv_total_blocks: 1000 }),
          now,
        ).state;
      }
      for (let round = 0; round < 1000 && queuedCount(state) > 0; round++) {
        now += 50;
        const roomBefore = rooms();
        const result = tick(state, now);
        state = result.state;
        checkBatches(result.batches, roomBefore);
        for (const notice of result.notices) {
          if (notice.kind !== "overdue") settle(notice.item.id, notice.kind);
        }
        for (const [originId, itemId] of inFlight()) {
          state = onItemDone(state, originId, itemId, now).state;
        }
      }
      expect(queuedCount(state)).toBe(0);
      expect(violations).toEqual([]);

      expect([...fates.keys()].every((id) => enqueueOrder.has(id))).toBe(true);
      for (const id of enqueueOrder.keys()) {
        expect({ id, fates: fates.get(id) ?? [] }).toEqual({
          id,
          fates: [expect.any(String)],
        });
      }
    });
  }
});
