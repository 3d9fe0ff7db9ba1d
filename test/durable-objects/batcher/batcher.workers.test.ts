import { env } from "cloudflare:workers";
import { abortAllDurableObjects, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { type Batcher } from "../../../durable-objects/batcher/index.ts";
import {
  type BatcherFailureTrailer,
  type BatcherSetup,
  OPEN_BATCH_RECORD_DELAY_MS,
} from "../../../durable-objects/batcher/types.ts";
import { BATCHING_DEFAULTS } from "../../../durable-objects/batcher/settings.ts";
import { DEFAULT_BREAKER_SETTINGS } from "../../../contracts/breaker.ts";
import { type WindowConfigInput, windowConfig } from "../../support/window-config.ts";
import { FrameType, type ItemTrailer, decodeJsonPayload } from "../../../contracts/protocol.ts";
import { chatBody, lastEvent } from "../../support/edge-requests.ts";
import {
  urlOf,
  HOLD,
  type AttemptOverrides,
  batcher,
  openOn,
  openedFrames,
  readItem,
  untilHead,
  counts,
  waitForCounts,
  quiet,
  direct,
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
async function untilQueued(b: ReturnType<typeof batcher>, n: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await b.stub.snapshot()).queued === n) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error(`never ${n} queued`);
}

/** Sets an origin's injected faults; null clears them. */
async function setFaults(id: string, faults: Record<string, unknown> | null): Promise<void> {
  const res = await fetch(`${urlOf(id)}/admin/faults`, {
    method: faults === null ? "DELETE" : "PUT",
    headers: { "content-type": "application/json" },
    ...(faults !== null && { body: JSON.stringify(faults) }),
  });
  expect(res.ok).toBe(true);
  await res.arrayBuffer();
}

/** An item `open` opened: its body, and its END trailer (null when none came). */
async function opened(b: ReturnType<typeof batcher>, id: string, over: AttemptOverrides) {
  const { opening, ending } = b.open(id, over);
  const result = await opening;
  if (result.kind !== "open") throw new Error(`expected open, got ${result.kind}`);
  const trailer = async (): Promise<ItemTrailer | null> => {
    const bytes = await ending;
    return bytes === null ? null : (decodeJsonPayload(bytes) as ItemTrailer);
  };
  return { head: result.head, body: result.body, trailer };
}

describe("answer: a JSON item whole, in one answer", () => {
  it("answers with the HEAD, the item's exact bytes and its END once the item ended", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 2 });
    const occupier = await occupy(b);
    const body = chatBody({ max_tokens: 7 });
    const result = await b.answer("w1", { body });
    if (result.kind !== "answered") throw new Error(`expected answered, got ${result.kind}`);
    expect(result.head).toMatchObject({ status: 200, origin: "batch-1" });
    expect(result.headMs).toBeGreaterThanOrEqual(0);
    expect(result.body).toEqual(await direct(body));
    const trailer = decodeJsonPayload(result.trailer ?? new Uint8Array()) as ItemTrailer;
    expect(trailer).toMatchObject({ id: "w1", outcome: "ok", usage: { completion_tokens: 7 } });
    await release(b, "occupier", occupier);
  });

  it("cancels a running item until its END, which still reports what it generated", async () => {
    const b = batcher(HOLD);
    const before = await quiet("batch-1");
    const answering = b.answer("w2", { body: { max_tokens: 2000 }, maxTokens: 2000 });
    await waitForCounts("batch-1", (c) => c.inFlight > before.inFlight);
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(await b.stub.cancel("w2", { untilEnd: true })).toBe(true);
    const result = await answering;
    if (result.kind !== "answered") throw new Error(`expected answered, got ${result.kind}`);
    expect(result.head).toMatchObject({ status: 200 });
    const trailer = decodeJsonPayload(result.trailer ?? new Uint8Array()) as ItemTrailer;
    expect(trailer).toMatchObject({ id: "w2", outcome: "cancelled" });
    expect(trailer.usage?.completion_tokens).toBeGreaterThan(0);
    expect((await b.stub.snapshot()).counters.cancelledRunning).toBe(1);
  });

  it("leaves an item waiting in its lane when its caller's request times out", async () => {
    const b = batcher(HOLD);
    const occupier = await occupy(b);
    const answering = b.answer("w6", { body: { max_tokens: 3 } });
    await untilQueued(b, 1);
    expect(await b.stub.cancel("w6", { timedOut: true, untilEnd: true })).toBe(false);
    expect((await b.stub.snapshot()).queued).toBe(1);
    await release(b, "occupier", occupier);
    expect(await answering).toMatchObject({ kind: "answered", head: { status: 200 } });
  });

  it("answers with neither HEAD nor END for an item cancelled while it waits", async () => {
    const b = batcher(HOLD);
    const occupier = await occupy(b);
    const answering = b.answer("w3");
    await untilQueued(b, 1);
    expect(await b.stub.cancel("w3")).toBe(true);
    expect(await answering).toMatchObject({ kind: "answered", head: null, trailer: null });
    expect((await b.stub.snapshot()).counters.cancelledWaiting).toBe(1);
    await release(b, "occupier", occupier);
  });

  it("answers with the lone END of an item that timed out in its lane, and refuses a full lane", async () => {
    const b = batcher({
      ...HOLD,
      lanes: [{ queueTimeoutMs: 100, onTimeout: "reject", maxQueue: 1 }],
    });
    const occupier = await occupy(b);
    const late = b.answer("w4");
    await untilQueued(b, 1);
    expect(await b.answer("w5")).toMatchObject({ kind: "refused", reason: "queue_full" });
    const result = await late;
    if (result.kind !== "answered") throw new Error(`expected answered, got ${result.kind}`);
    expect(result.head).toBeNull();
    expect(decodeJsonPayload(result.trailer ?? new Uint8Array())).toMatchObject({
      id: "w4",
      outcome: "timeout",
      error: { code: "queue_timeout" },
    });
    await release(b, "occupier", occupier);
  });
});

describe("open: a streamed answer's body on a stream of its own", () => {
  it("answers with the HEAD and the item's exact bytes, and `end` with its END", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 2 });
    const occupier = await occupy(b);
    const body = chatBody({ stream: true, max_tokens: 9, stream_options: { include_usage: true } });
    await direct(body);
    const item = await opened(b, "p1", { body });
    expect(item.head).toMatchObject({ status: 200, origin: "batch-1" });
    expect(new Uint8Array(await new Response(item.body).arrayBuffer())).toEqual(await direct(body));
    expect(await item.trailer()).toMatchObject({ id: "p1", outcome: "ok" });
    await release(b, "occupier", occupier);
  });

  it("ends the body with a timeout error event when the caller gives up on the item", async () => {
    const b = batcher(HOLD);
    const before = await quiet("batch-1");
    const item = await opened(b, "p2", { body: { max_tokens: 2000 } });
    const reader = item.body.getReader();
    await reader.read();
    expect(await b.stub.cancel("p2", { timedOut: true })).toBe(true);
    let text = "";
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      text += new TextDecoder().decode(chunk.value);
    }
    expect(lastEvent(text)).toMatchObject({
      last: { error: { type: "server_error", code: "origin_timeout" } },
      done: false,
    });
    const after = await waitForCounts("batch-1", (c) => c.inFlight === before.inFlight);
    expect(after.inFlight).toBe(before.inFlight);
  });

  it("cancels the item until its END when the client leaves the body", async () => {
    const b = batcher(HOLD);
    const item = await opened(b, "p3", { body: { max_tokens: 2000 } });
    const reader = item.body.getReader();
    await reader.read();
    await reader.cancel();
    // Noticed at the batcher's next write to the body; no cancel RPC needed.
    const trailer = await item.trailer();
    expect(trailer).toMatchObject({ id: "p3", outcome: "cancelled" });
    expect(trailer?.usage?.completion_tokens).toBeGreaterThan(0);
    expect((await b.stub.snapshot()).counters.cancelledRunning).toBe(1);
  });

  it("answers with the trailer of an END that came before any HEAD, and no body", async () => {
    const b = batcher({ ...HOLD, lanes: [{ queueTimeoutMs: 100, onTimeout: "reject" }] });
    const occupier = await occupy(b);
    const { opening, ending } = b.open("p4");
    const trailer = { id: "p4", outcome: "timeout", error: { code: "queue_timeout" } };
    expect(await opening).toMatchObject({ kind: "ended", trailer });
    // `end` was already waiting: the same lone END.
    const end = await ending;
    expect(end === null ? null : decodeJsonPayload(end)).toMatchObject(trailer);
    await release(b, "occupier", occupier);
  });

  it("answers `cancelled` for an item cancelled while it waits", async () => {
    const b = batcher(HOLD);
    const occupier = await occupy(b);
    const { opening, ending } = b.open("p6");
    await untilQueued(b, 1);
    expect(await b.stub.cancel("p6")).toBe(true);
    expect(await opening).toEqual({ kind: "cancelled" });
    expect(await ending).toBeNull();
    expect((await b.stub.snapshot()).counters.cancelledWaiting).toBe(1);
    await release(b, "occupier", occupier);
  });

  it("ends the body with an error event when the origin fails the item after its HEAD", async () => {
    const b = batcher(HOLD);
    await setFaults("batch-1", { dropAfterTokens: 2, dropRate: 1 });
    try {
      const item = await opened(b, "p7", { body: { max_tokens: 20 } });
      const text = await new Response(item.body).text();
      expect(lastEvent(text)).toMatchObject({
        last: { error: { code: "origin_error" } },
        done: false,
      });
      expect(await item.trailer()).toMatchObject({ id: "p7", outcome: "error" });
    } finally {
      await setFaults("batch-1", null);
    }
  });

  it("cuts a client that stops reading once its backlog passes the cap, and still bills it", async () => {
    // eu-1 answers at once; 2000 tokens are far more than the 64 KiB the stream buffers.
    const b = batcher({}, ["eu-1"], 1024);
    const item = await opened(b, "p8", { body: { max_tokens: 2000 } });
    // The client reads nothing until its item has ended.
    const trailer = await item.trailer();
    expect(trailer?.usage?.completion_tokens).toBeGreaterThan(0);
    expect(trailer?.outcome).toBe("cancelled");
    // What it then reads is what was buffered, ending in an error, never a clean end.
    const read = await new Response(item.body).arrayBuffer().then(
      (bytes) => `ended cleanly after ${bytes.byteLength} bytes`,
      (error: unknown) => error,
    );
    expect(read).toBeInstanceOf(Error);
  });

  it("answers a body its client left before taking it whole as cancelled, not ok", async () => {
    // eu-1 answers at once: the item has ended while most of its body still waits to be taken.
    const b = batcher({}, ["eu-1"]);
    const item = await opened(b, "p9", { body: { max_tokens: 2000 } });
    await new Promise((resolve) => setTimeout(resolve, 300));
    await item.body.cancel();
    const trailer = await item.trailer();
    expect(trailer).toMatchObject({ id: "p9", outcome: "cancelled" });
    expect(trailer?.usage?.completion_tokens).toBeGreaterThan(0);
  });

  it("errors the body and the END when the batcher goes away mid-stream", async () => {
    const b = batcher(HOLD);
    const item = await opened(b, "p5", { body: { max_tokens: 2000 } });
    const reader = item.body.getReader();
    await reader.read();
    // Caught at once: the rejection comes while the test awaits the body.
    const trailer = item.trailer().then(
      () => "ended",
      (error: unknown) => error,
    );
    await abortAllDurableObjects();
    const rest = (async () => {
      for (;;) if ((await reader.read()).done) return "ended";
    })();
    await expect(rest).rejects.toThrow("disconnected prematurely");
    expect(await trailer).toBeInstanceOf(Error);
  });
});

describe("bytes", () => {
  it("hands every item of a call exactly the bytes the origin produces for it alone", async () => {
    const b = batcher({ ...HOLD, maxBatchSize: 3 });
    const occupier = await occupy(b);
    const bodies = [
      chatBody({ stream: true, max_tokens: 12, messages: [{ role: "user", content: "One." }] }),
      chatBody({ stream: false, max_tokens: 7, messages: [{ role: "user", content: "Two." }] }),
      chatBody({
        stream: true,
        max_tokens: 9,
        stream_options: { include_usage: true },
        messages: [{ role: "user", content: "Three." }],
      }),
    ];
    // Warm the prefix cache first: `cached_tokens` depends on it.
    for (const body of bodies) await direct(body);
    const streams = bodies.map((body, i) =>
      b.stream(`bytes-${i}`, { body, timeHead: body.stream === true }),
    );
    const items = await Promise.all(streams.map(readItem));
    expect((await b.stub.snapshot()).recentBatches.at(-1)?.items).toHaveLength(3);
    for (const [i, body] of bodies.entries()) {
      expect(items[i]?.trailer?.outcome).toBe("ok");
      expect(items[i]?.body).toEqual(await direct(body));
    }
    await release(b, "occupier", occupier);
  });
});

describe("reading a call's answer", () => {
  it("gives way to the rest of the object while it reads a long answer, bytes unchanged", async () => {
    const b = batcher();
    // About 20 ms a token: reading this answer takes several turns of READ_TURN_MS.
    const body = chatBody({ stream: true, max_tokens: 24, seed: 11 });
    const expected = await direct(body);
    const item = await readItem(b.stream("long", { body, maxTokens: 24 }));
    expect(item.trailer?.outcome).toBe("ok");
    expect(item.body).toEqual(expected);
    const snapshot = await b.stub.snapshot();
    expect(snapshot.counters.readPauses).toBeGreaterThan(0);
    expect(snapshot.threadLagMs).toBeGreaterThanOrEqual(0);
    expect(Number.isFinite(snapshot.threadLagMs)).toBe(true);
  });
});

/**
 * Makes the batcher's thread lag: while a long item streams (its reading gives way behind a
 * zero-delay timer after every slow read), the object's thread is kept busy in stretches of
 * `busyMs`, so those timers fire about that late. Returns the snapshot taken right after.
 */
async function lagThread(b: ReturnType<typeof batcher>, busyMs: number, stretches: number) {
  const frames = b.stream("lagger", {
    body: { max_tokens: 2000 },
    maxTokens: 2000,
    avoidOrigins: b.setup.origins.map((o) => o.id).filter((id) => id !== "batch-1"),
  });
  await untilHead(frames);
  await runInDurableObject(b.stub, async () => {
    for (let i = 0; i < stretches; i++) {
      const until = Date.now() + busyMs;
      // oxlint-disable-next-line no-empty
      while (Date.now() < until) {}
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  });
  const snapshot = await b.stub.snapshot();
  await release(b, "lagger", frames);
  return snapshot;
}

/** A streamed body's reads, as text. */
async function reads(body: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  const decoder = new TextDecoder();
  for await (const chunk of body) out.push(decoder.decode(chunk));
  return out;
}

/**
 * A 12-token streamed item from eu-1, which answers at once (its tokens come much faster
 * than any hold), opened once the thread lags, and read to its end.
 */
async function itemAfterLag(window: Partial<WindowConfigInput>, id: string) {
  const b = batcher(window, ["batch-1", "eu-1"]);
  const body = chatBody({ stream: true, max_tokens: 12, seed: 4 });
  const expected = new TextDecoder().decode(await direct(body, "eu-1"));
  const lagged = await lagThread(b, 40, 12);
  const item = await opened(b, id, { body, maxTokens: 12, avoidOrigins: ["batch-1"] });
  const chunks = await reads(item.body);
  const after = await b.stub.snapshot();
  return { expected, lagged, head: item.head, chunks, trailer: await item.trailer(), after };
}

describe("holding a streamed item's later tokens while the thread lags", () => {
  it("joins later tokens into fewer writes; the first step leaves at once, bytes unchanged", async () => {
    const { expected, lagged, head, chunks, trailer, after } = await itemAfterLag(
      { holdShare: 1, maxHoldMs: 100 },
      "held",
    );
    expect(lagged.threadLagMs).toBeGreaterThan(10);
    expect(lagged.holdMs).toBeGreaterThan(10);
    expect(head.origin).toBe("eu-1");
    expect(chunks.join("")).toEqual(expected);
    expect(trailer).toMatchObject({ id: "held", outcome: "ok" });
    // The first step leaves on its own; the rest waits for the hold and leaves with the END
    // (unheld, its 14 events leave in about six writes).
    expect(chunks.length).toBeGreaterThan(1);
    expect(chunks.length).toBeLessThanOrEqual(3);
    expect(after.counters.holds).toBeGreaterThan(0);
  });

  it("holds nothing with a hold share of 0, however late the thread runs", async () => {
    const { expected, lagged, chunks, trailer, after } = await itemAfterLag(
      { holdShare: 0 },
      "unheld",
    );
    expect(lagged.threadLagMs).toBeGreaterThan(10);
    expect(lagged.holdMs).toBe(0);
    expect(chunks.join("")).toEqual(expected);
    expect(trailer).toMatchObject({ id: "unheld", outcome: "ok" });
    expect(after.counters.holds).toBe(0);
  });
});

/** Counts every write to the batcher's `open_batches` table from now on, by kind. */
async function watchRecords(b: ReturnType<typeof batcher>) {
  // Creates the object (and its tables) before the triggers go in.
  await b.stub.snapshot();
  await runInDurableObject(b.stub, (_instance: Batcher, state) => {
    state.storage.sql.exec(`CREATE TABLE writes_seen (kind TEXT NOT NULL);
      CREATE TRIGGER seen_insert AFTER INSERT ON open_batches
        BEGIN INSERT INTO writes_seen VALUES ('insert'); END;
      CREATE TRIGGER seen_delete AFTER DELETE ON open_batches
        BEGIN INSERT INTO writes_seen VALUES ('delete'); END;`);
  });
  return () =>
    runInDurableObject(b.stub, (_instance: Batcher, state) => ({
      rows: state.storage.sql.exec<{ n: number }>("SELECT COUNT(*) AS n FROM open_batches").one().n,
      writes: state.storage.sql
        .exec<{ kind: string }>("SELECT kind FROM writes_seen")
        .toArray()
        .map((row) => row.kind),
    }));
}

describe("open_batches", () => {
  it("never writes a row for a call that ends within the record delay", async () => {
    // eu-1 answers at once (no simulated time).
    const b = batcher({}, ["eu-1"]);
    const records = await watchRecords(b);
    const item = await readItem(b.stream("quick", { body: { max_tokens: 1 } }));
    expect(item.trailer).toMatchObject({ id: "quick", outcome: "ok" });
    // snapshot commits whatever is still queued.
    expect((await b.stub.snapshot()).persistedBatches).toBe(0);
    expect(await records()).toEqual({ rows: 0, writes: [] });
  });

  it("records a call once it has run for the record delay and deletes it when it ends", async () => {
    const b = batcher(HOLD);
    const records = await watchRecords(b);
    const occupier = await occupy(b);
    // Written by the queue's own timer, without a read that flushes it.
    let seen = await records();
    for (let i = 0; i < 100 && seen.rows === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, OPEN_BATCH_RECORD_DELAY_MS / 4));
      seen = await records();
    }
    expect(seen).toEqual({ rows: 1, writes: ["insert"] });
    await release(b, "occupier", occupier);
    for (let i = 0; i < 100 && seen.rows === 1; i++) {
      await new Promise((resolve) => setTimeout(resolve, OPEN_BATCH_RECORD_DELAY_MS / 4));
      seen = await records();
    }
    expect(seen).toEqual({ rows: 0, writes: ["insert", "delete"] });
  });
});

describe("restart", () => {
  it("ends every caller with an error, and cancels the orphaned calls on their origins", async () => {
    const b = batcher(HOLD);
    const before = await quiet("batch-1");
    const occupier = await occupy(b);
    const waiting = ["e1", "e2"].map((id) => b.stream(id));
    expect((await b.stub.snapshot()).queued).toBe(2);

    // The object goes away mid-window, as on a crash or a deploy.
    await abortAllDurableObjects();

    const ends = await Promise.all([occupier, ...waiting].map(readItem));
    // Nobody gets an answer: no HEAD for the waiting ones, no END for anyone, an error instead.
    // (The occupier's HEAD was read before.)
    expect(ends.map((end) => [end.head, end.trailer, typeof end.stopped])).toEqual([
      [null, null, "string"],
      [null, null, "string"],
      [null, null, "string"],
    ]);
    // A new incarnation finds the call the old one left open and cancels it once; the
    // alarm may already have run by itself.
    const stub = env.BATCHER.getByName(`test:${b.setup.version}`);
    await runDurableObjectAlarm(stub);
    const swept = await stub.snapshot();
    expect(swept.counters.submitted).toBe(0);
    expect(swept.persistedBatches).toBe(0);
    expect(swept.counters.orphansCancelled).toBe(1);
    await runDurableObjectAlarm(stub);
    expect((await stub.snapshot()).counters.orphansCancelled).toBe(1);
    // The origin ran only the occupier and has stopped it.
    const after = await waitForCounts("batch-1", (c) => c.inFlight === before.inFlight);
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 1]);
    expect(after.inFlight).toBe(before.inFlight);
  });
});

describe("origin failures", () => {
  it("fails items before their HEAD when the origin cannot be reached, and skips it after", async () => {
    const setup: BatcherSetup = {
      version: `dead-${crypto.randomUUID().slice(0, 8)}`,
      region: "test",
      breakers: { enabled: false, settings: DEFAULT_BREAKER_SETTINGS },
      routing: null,
      window: windowConfig({ origins: [{ id: "dead" }, { id: "batch-2" }] }),
      origins: [
        { id: "dead", url: "http://127.0.0.1:9" },
        { id: "batch-2", url: urlOf("batch-2") },
      ],
      quarantineMs: 60_000,
      clientBacklogBytes: BATCHING_DEFAULTS.max_client_backlog_bytes,
    };
    const stub = env.BATCHER.getByName(`test:${setup.version}`);
    const stream = (id: string) => {
      const { opening, ending } = openOn(stub, {
        setup,
        id,
        path: "/v1/chat/completions",
        body: JSON.stringify(chatBody({ stream: true, max_tokens: 2 })),
        headers: {},
        lane: 0,
        promptTokens: 30,
        maxTokens: 2,
        deadline: Date.now() + 60_000,
        firstByteTimeoutMs: 5_000,
        timeHead: true,
        itemTimeoutMs: 60_000,
        avoidOrigins: [],
      });
      return openedFrames(opening, ending);
    };
    const first = await readItem(stream("f1"));
    expect(first.head).toBeNull();
    expect(first.trailer).toMatchObject({
      outcome: "error",
      origin: "dead",
      error: { code: "origin_unavailable" },
    });
    const second = await readItem(stream("f2"));
    expect(second.head).toMatchObject({ status: 200, origin: "batch-2" });
  });
});
