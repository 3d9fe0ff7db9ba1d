import { describe, expect, it } from "vitest";
import { ClientBody } from "../../../../durable-objects/batcher/callers/client-body.ts";

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (chunk: Uint8Array) => new TextDecoder().decode(chunk);

/** A body whose writes complete only when the test says so, recording what each carried. */
function slowSink() {
  const writes: string[] = [];
  const done: (() => void)[] = [];
  let closed = false;
  let aborted: unknown = null;
  const writable = new WritableStream<Uint8Array>(
    {
      write(chunk) {
        writes.push(text(chunk));
        return new Promise<void>((resolve) => done.push(resolve));
      },
      close() {
        closed = true;
      },
      abort(reason) {
        aborted = reason;
      },
    },
    { highWaterMark: 1 },
  );
  return {
    writable,
    writes,
    /** Completes the oldest write still in flight. */
    async complete() {
      done.shift()?.();
      await new Promise((resolve) => setTimeout(resolve, 0));
    },
    state: () => ({ closed, aborted }),
  };
}

const settle = () => new Promise((resolve) => setTimeout(resolve, 0));

/** A body over a {@link slowSink} whose first write, "a", is in flight. */
async function writingA(maxBacklogBytes?: number) {
  const sink = slowSink();
  const body = new ClientBody(sink.writable, maxBacklogBytes);
  body.push(bytes("a"));
  body.flush();
  await settle();
  return { sink, body };
}

describe("ClientBody", () => {
  it("writes at once when no write is in flight, and joins what comes during one", async () => {
    const { sink, body } = await writingA();
    expect(sink.writes).toEqual(["a"]);
    body.push(bytes("b"));
    body.flush();
    body.push(bytes("c"));
    body.flush();
    await settle();
    // "a" is still being written: "b" and "c" wait for it, then leave together.
    expect(sink.writes).toEqual(["a"]);
    await sink.complete();
    expect(sink.writes).toEqual(["a", "bc"]);
  });

  it("closes only after every queued byte is written", async () => {
    const sink = slowSink();
    const body = new ClientBody(sink.writable);
    body.push(bytes("a"));
    body.flush();
    body.push(bytes("b"));
    body.close();
    // Nothing after close is taken.
    body.push(bytes("late"));
    await settle();
    expect(sink.state().closed).toBe(false);
    await sink.complete();
    await sink.complete();
    await settle();
    expect(sink.writes).toEqual(["a", "b"]);
    expect(sink.state().closed).toBe(true);
  });

  it("drops what is queued and never closes cleanly when aborted", async () => {
    const { sink, body } = await writingA();
    body.push(bytes("b"));
    body.abort("item cancelled");
    await sink.complete();
    await settle();
    expect(sink.writes).toEqual(["a"]);
    expect(sink.state()).toEqual({ closed: false, aborted: "item cancelled" });
    await expect(body.closed).rejects.toBe("item cancelled");
  });

  it("stops writing when the client went away, and says so through closed", async () => {
    const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
    const body = new ClientBody(writable);
    await readable.cancel("client left");
    body.push(bytes("a"));
    body.flush();
    await expect(body.closed).rejects.toBe("client left");
    body.push(bytes("b"));
    body.close();
    await settle();
  });

  it("cuts a client whose backlog behind a write outgrows the cap, and says so through closed", async () => {
    const { sink, body } = await writingA(4);
    // "a" is never taken: what follows waits, up to four bytes.
    body.push(bytes("bc"));
    body.push(bytes("de"));
    body.flush();
    await settle();
    expect(sink.state().aborted).toBeNull();
    body.push(bytes("f"));
    // Told at once, though the stalled write has not finished.
    await expect(body.closed).rejects.toBe("the client reads too slowly");
    expect(sink.writes).toEqual(["a"]);
    // Once it does, the body is aborted, never closed cleanly, and nothing more is written.
    await sink.complete();
    expect(sink.state()).toEqual({ closed: false, aborted: "the client reads too slowly" });
    expect(sink.writes).toEqual(["a"]);
  });

  it("counts only what waits: a backlog written out makes room again", async () => {
    const { sink, body } = await writingA(4);
    body.push(bytes("bcd"));
    body.flush();
    await sink.complete();
    // "bcd" left in the next write; four more bytes may wait behind it.
    body.push(bytes("efgh"));
    body.flush();
    await sink.complete();
    await sink.complete();
    expect(sink.writes).toEqual(["a", "bcd", "efgh"]);
    expect(sink.state().aborted).toBeNull();
  });
});
