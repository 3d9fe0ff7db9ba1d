import { describe, expect, it } from "vitest";
import {
  batcher,
  readItem,
  trailerOf,
  untilHead,
  urlOf,
} from "../../support/batcher-harness.workers.ts";

// garbled-1 answers the batch protocol, garbling the frame each item's `user` names.
const decoder = new TextDecoder();

describe("a call whose origin sends a malformed frame", () => {
  it("fails an item whose HEAD is not JSON as an origin error, before its HEAD", async () => {
    const b = batcher({}, ["garbled-1"]);
    const result = await b.answer("g-head", { body: { user: "bad-head" } });
    if (result.kind !== "answered") throw new Error(`expected answered, got ${result.kind}`);
    expect(result.head).toBeNull();
    expect(trailerOf(result.trailer)).toMatchObject({
      id: "g-head",
      outcome: "error",
      error: { code: "origin_error", message: expect.stringContaining("malformed HEAD") },
    });
  });

  it("fails every item of a call whose LOAD is not a load report", async () => {
    const b = batcher({}, ["garbled-1"]);
    const result = await b.answer("g-load", { body: { user: "bad-load" } });
    if (result.kind !== "answered") throw new Error(`expected answered, got ${result.kind}`);
    expect(trailerOf(result.trailer)).toMatchObject({ error: { code: "origin_error" } });
  });

  it("cuts an opened item whose END has no outcome: its body ends with the error event", async () => {
    const b = batcher({}, ["garbled-1"]);
    const frames = b.stream("g-end", { body: { user: "bad-end" } });
    expect(await untilHead(frames)).toMatchObject({ status: 200, origin: "garbled-1" });
    // The origin sends the END once the HEAD is in.
    await fetch(`${urlOf("garbled-1")}/release`, { method: "POST" });
    const rest = await readItem(frames);
    expect(rest.trailer).toBeNull();
    expect(decoder.decode(rest.body)).toContain('"code":"origin_error"');
  });

  it("still answers an item of a well-formed call in full", async () => {
    const b = batcher({}, ["garbled-1"]);
    const result = await b.answer("g-ok");
    if (result.kind !== "answered") throw new Error(`expected answered, got ${result.kind}`);
    expect(result.head).toMatchObject({ status: 200 });
    expect(trailerOf(result.trailer)).toMatchObject({ id: "g-ok", outcome: "ok" });
  });
});
