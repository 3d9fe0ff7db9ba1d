import { describe, expect, it } from "vitest";
import { type BatcherFailureTrailer } from "../../../durable-objects/batcher/types.ts";
import { FrameType } from "../../../contracts/protocol/framing.ts";
import {
  HOLD,
  batcher,
  readItem,
  untilHead,
  counts,
  waitForCounts,
  quiet,
  release,
  occupy,
} from "../../support/batcher-harness.workers.ts";

describe("dispatch", () => {
  it("sends a lone request at once, alone, without a window", async () => {
    const b = batcher(HOLD);
    const before = await quiet("batch-1");
    const frames = b.stream("lone");
    const snapshot = await b.stub.snapshot();
    // Decided inside `open`: sent before any timer could have run.
    expect(snapshot.counters).toMatchObject({ submitted: 1, dispatchedAtOnce: 1, queued: 0 });
    expect(snapshot.queued).toBe(0);
    expect(snapshot.recentBatches).toEqual([
      expect.objectContaining({ originId: "batch-1", reason: "idle", items: ["lone"] }),
    ]);
    const item = await readItem(frames);
    expect(item.head).toMatchObject({ id: "lone", status: 200, origin: "batch-1" });
    expect(item.trailer).toMatchObject({ id: "lone", outcome: "ok" });
    const after = await counts("batch-1");
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 1]);
  });

  it("flushes as soon as the batch size is reached: one call for four requests", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 4 });
    const occupier = await occupy(b);
    const before = await counts("batch-1");
    const streams = ["s1", "s2", "s3", "s4"].map((id) => b.stream(id));
    const items = await Promise.all(streams.map(readItem));
    expect(items.map((i) => i.trailer?.outcome)).toEqual(["ok", "ok", "ok", "ok"]);
    const after = await counts("batch-1");
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 4]);
    const snapshot = await b.stub.snapshot();
    expect(snapshot.counters.batches).toMatchObject({ idle: 1, size: 1 });
    expect(snapshot.recentBatches.at(-1)).toMatchObject({
      reason: "size",
      items: ["s1", "s2", "s3", "s4"],
    });
    await release(b, "occupier", occupier);
  });

  it("flushes when prompt plus max_tokens reach the token budget, within the budget", async () => {
    const b = batcher({ ...HOLD, maxBatchTokens: 250 });
    const occupier = await occupy(b);
    const before = await counts("batch-1");
    // 100 tokens each: the third reaches the budget; the first two fit in it.
    const streams = ["t1", "t2", "t3"].map((id) =>
      b.stream(id, { promptTokens: 96, maxTokens: 4 }),
    );
    const items = await Promise.all(streams.map(readItem));
    expect(items.map((i) => i.trailer?.outcome)).toEqual(["ok", "ok", "ok"]);
    const snapshot = await b.stub.snapshot();
    expect(snapshot.recentBatches.slice(1)).toEqual([
      expect.objectContaining({ reason: "tokens", items: ["t1", "t2"] }),
      expect.objectContaining({ reason: "window", items: ["t3"] }),
    ]);
    const after = await counts("batch-1");
    expect([after.batches - before.batches, after.items - before.items]).toEqual([2, 3]);
    await release(b, "occupier", occupier);
  });

  it("flushes a partial batch when the window's deadline arrives", async () => {
    const b = batcher({ maxWindowMs: 50, callIntervalMs: 1000 });
    const occupier = await occupy(b);
    const before = await counts("batch-1");
    const streams = ["w1", "w2"].map((id) => b.stream(id));
    const queued = await b.stub.snapshot();
    expect(queued.counters.queued).toBe(2);
    const items = await Promise.all(streams.map(readItem));
    expect(items.map((i) => i.trailer?.outcome)).toEqual(["ok", "ok"]);
    const snapshot = await b.stub.snapshot();
    expect(snapshot.recentBatches.at(-1)).toMatchObject({ reason: "window", items: ["w1", "w2"] });
    const after = await counts("batch-1");
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 2]);
    await release(b, "occupier", occupier);
  });

  it("keeps several calls in flight to one origin", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 2 });
    const occupier = await occupy(b);
    const long = { body: { max_tokens: 200 }, maxTokens: 200 };
    const heads = ["m1", "m2", "m3", "m4"].map((id) => b.stream(id, long));
    await Promise.all(heads.map(untilHead));
    const snapshot = await b.stub.snapshot();
    expect(snapshot.openBatches).toBe(3);
    expect(snapshot.inFlight).toEqual({ "batch-1": 5 });
    await Promise.all(heads.map((frames, i) => release(b, `m${i + 1}`, frames)));
    await release(b, "occupier", occupier);
  });
});

describe("lanes", () => {
  it("sends higher lanes first and keeps arrival order within a lane", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 5 });
    const occupier = await occupy(b);
    const order: [string, number][] = [
      ["low-a", 2],
      ["high-a", 0],
      ["mid-a", 1],
      ["high-b", 0],
      ["low-b", 2],
    ];
    await Promise.all(order.map(([id, lane]) => readItem(b.stream(id, { lane }))));
    const snapshot = await b.stub.snapshot();
    expect(snapshot.recentBatches.at(-1)?.items).toEqual([
      "high-a",
      "high-b",
      "mid-a",
      "low-a",
      "low-b",
    ]);
    await release(b, "occupier", occupier);
  });

  it("ends a request that waited past its lane's timeout with queue_timeout and the lane's status", async () => {
    const b = batcher({
      ...HOLD,
      lanes: [{ queueTimeoutMs: 100, onTimeout: "reject", refuseStatus: 429 }],
    });
    const occupier = await occupy(b);
    const before = await counts("batch-1");
    const item = await readItem(b.stream("late"));
    expect(item.head).toBeNull();
    const trailer = item.trailer as BatcherFailureTrailer;
    expect(trailer).toMatchObject({
      id: "late",
      outcome: "timeout",
      usage: null,
      status: 429,
      error: { code: "queue_timeout" },
    });
    expect(trailer.retry_after_ms).toBeGreaterThan(0);
    const after = await counts("batch-1");
    expect(after.items).toBe(before.items);
    expect((await b.stub.snapshot()).counters.queueTimeouts).toBe(1);
    await release(b, "occupier", occupier);
  });

  it("refuses a request to a full lane at once with retryAfterMs", async () => {
    const b = batcher({ ...HOLD, lanes: [{ maxQueue: 1 }, {}] });
    const occupier = await occupy(b);
    const first = b.stream("q1");
    const refused = await b.open("q2").opening;
    expect(refused).toEqual({
      kind: "refused",
      reason: "queue_full",
      status: 503,
      retryAfterMs: expect.any(Number),
    });
    expect(refused.kind === "refused" && refused.retryAfterMs).toBeGreaterThanOrEqual(1000);
    // Another lane still has room.
    const other = b.stream("q3", { lane: 1 });
    expect((await b.stub.snapshot()).queued).toBe(2);
    await release(b, "q1", first);
    await release(b, "q3", other);
    await release(b, "occupier", occupier);
  });
});

describe("cancellation", () => {
  it("removes a waiting request: it never reaches the origin", async () => {
    const b = batcher(HOLD);
    const occupier = await occupy(b);
    const before = await counts("batch-1");
    const waiting = b.stream("c1");
    expect((await b.stub.snapshot()).queued).toBe(1);
    // What the edge does when its client goes away: tell the batcher.
    await release(b, "c1", waiting);
    const snapshot = await b.stub.snapshot();
    expect(snapshot.queued).toBe(0);
    expect(snapshot.counters.cancelledWaiting).toBe(1);
    expect(await b.stub.cancel("c1")).toBe(false);
    await release(b, "occupier", occupier);
    let done = await b.stub.snapshot();
    for (let i = 0; i < 200 && done.openBatches > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      done = await b.stub.snapshot();
    }
    expect(done.recentBatches.map((batch) => batch.items)).toEqual([["occupier"]]);
    expect((await counts("batch-1")).items).toBe(before.items);
  });

  it("cancels a streaming request on its origin, which frees its slot", async () => {
    const b = batcher(HOLD);
    const before = await quiet("batch-1");
    const frames = b.stream("c2", { body: { max_tokens: 2000 } });
    await untilHead(frames);
    const first = await frames.next();
    expect(typeof first !== "string" && first.type).toBe(FrameType.DATA);
    await release(b, "c2", frames);
    const after = await waitForCounts(
      "batch-1",
      (c) => c.inFlight === before.inFlight && c.dropped > before.dropped,
    );
    // Alone in its call: closing the call cancelled it (the origin counts a dropped call).
    expect(after.inFlight).toBe(before.inFlight);
    expect(after.dropped).toBe(before.dropped + 1);
  });

  it("cancels a running request until its END, which still reports what it generated", async () => {
    const b = batcher(HOLD);
    const frames = b.stream("u1", { body: { max_tokens: 2000 } });
    await untilHead(frames);
    await frames.next();
    expect(await b.stub.cancel("u1", { untilEnd: true })).toBe(true);
    const rest = await readItem(frames);
    expect(rest.trailer).toMatchObject({ id: "u1", outcome: "cancelled" });
    expect(rest.trailer?.usage?.completion_tokens).toBeGreaterThan(0);
    expect((await b.stub.snapshot()).counters.cancelledRunning).toBe(1);
  });

  it("cancels one streaming request of a call without disturbing its neighbour", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 2 });
    const occupier = await occupy(b);
    const before = await counts("batch-1");
    const goneFrames = b.stream("n1", { body: { max_tokens: 2000 } });
    const kept = b.stream("n2", { body: { max_tokens: 8 } });
    await untilHead(goneFrames);
    await release(b, "n1", goneFrames);
    const neighbour = await readItem(kept);
    expect(neighbour.trailer).toMatchObject({ id: "n2", outcome: "ok" });
    const after = await waitForCounts("batch-1", (c) => c.cancelled > before.cancelled);
    expect(after.cancelled).toBe(before.cancelled + 1);
    await release(b, "occupier", occupier);
  });
});

/** Waits until `n` items wait in the batcher's lanes. */
