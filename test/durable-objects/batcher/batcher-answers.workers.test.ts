import { abortAllDurableObjects } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { parsePayload } from "../../../contracts/protocol/framing.ts";
import { ItemTrailerSchema } from "../../../contracts/protocol/schema.ts";
import { chatBody, lastEvent } from "../../support/edge-requests.ts";
import {
  HOLD,
  batcher,
  readItem,
  waitForCounts,
  quiet,
  direct,
  release,
  occupy,
  untilQueued,
  setFaults,
  opened,
  trailerOf,
} from "../../support/batcher-harness.workers.ts";

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
    const trailer = trailerOf(result.trailer);
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
    const trailer = trailerOf(result.trailer);
    expect(trailer).toMatchObject({ id: "w2", outcome: "cancelled" });
    expect(trailer?.usage?.completion_tokens).toBeGreaterThan(0);
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
    expect(trailerOf(result.trailer)).toMatchObject({
      id: "w4",
      outcome: "timeout",
      error: { code: "queue_timeout" },
    });
    await release(b, "occupier", occupier);
  });
});

describe("settings: sent until the batcher holds them", () => {
  it("answers setup_needed to a call without them until one brought them", async () => {
    const b = batcher();
    expect(await b.answer("n1", { setup: undefined })).toEqual({ kind: "setup_needed" });
    expect(await b.open("n2", { setup: undefined }).opening).toEqual({ kind: "setup_needed" });
    expect((await b.stub.snapshot()).counters.submitted).toBe(0);
    expect(await b.answer("n3")).toMatchObject({ kind: "answered", head: { status: 200 } });
    expect(await b.answer("n4", { setup: undefined })).toMatchObject({
      kind: "answered",
      head: { status: 200 },
    });
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
    expect(trailerOf(end)).toMatchObject(trailer);
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
    const streams = bodies.map((body, i) => b.stream(`bytes-${i}`, { body }));
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

describe("the first-byte timeout", () => {
  it("covers a streamed item's HEAD, and one answered whole while its origin is idle", async () => {
    // Each item waits 1.5 s at the origin before its engine starts it, and so its HEAD.
    await setFaults("batch-2", { latencyMs: 1500 });
    try {
      const streamed = await readItem(
        batcher({}, ["batch-2"]).stream("late-head-1", { firstByteTimeoutMs: 200 }),
      );
      expect(streamed.head).toBeNull();
      expect(streamed.trailer).toMatchObject({
        outcome: "timeout",
        error: { code: "origin_timeout" },
        origin: "batch-2",
      });
      // The origin took the call: it may hold what it generated, however slow to tell.
      expect(streamed.trailer).not.toHaveProperty("unreachable");
      // Answered whole, its HEAD comes with the whole answer: what times it is the origin's
      // reports showing its engine idle, as it is while the fault holds the item back.
      const whole = await batcher({}, ["batch-2"]).answer("late-head-2", {
        firstByteTimeoutMs: 200,
      });
      if (whole.kind !== "answered") throw new Error(`expected answered, got ${whole.kind}`);
      expect(whole.head).toBeNull();
      const trailer = parsePayload(ItemTrailerSchema, whole.trailer ?? new Uint8Array());
      expect(trailer).toMatchObject({ outcome: "timeout", error: { code: "origin_timeout" } });
    } finally {
      await setFaults("batch-2", null);
    }
  });

  it("does not cut an answer read whole while its engine generates it", async () => {
    // About 20 ms a token at this origin: the answer takes several first-byte timeouts.
    const whole = await batcher({}, ["batch-2"]).answer("long-whole", {
      firstByteTimeoutMs: 200,
      body: { max_tokens: 40 },
      maxTokens: 40,
    });
    if (whole.kind !== "answered") throw new Error(`expected answered, got ${whole.kind}`);
    expect(whole.head).toMatchObject({ status: 200, origin: "batch-2" });
    const trailer = parsePayload(ItemTrailerSchema, whole.trailer ?? new Uint8Array());
    expect(trailer).toMatchObject({ id: "long-whole", outcome: "ok" });
    expect(trailer?.usage?.completion_tokens).toBe(40);
  });
});
