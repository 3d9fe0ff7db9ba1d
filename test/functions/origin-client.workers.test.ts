import { describe, expect, it } from "vitest";
import { frameReader } from "../../contracts/upstream.ts";
import { openItemFromFrames } from "../../functions/origin-client.ts";
import {
  FrameType,
  type ItemHead,
  type ItemTrailer,
  concatBytes,
  encodeFrame,
  encodeJsonFrame,
} from "../../contracts/protocol.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const data = (text: string) => encodeFrame(FrameType.DATA, 0, encoder.encode(text));
const trailer: ItemTrailer = {
  id: "req_1",
  outcome: "ok",
  usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, cached_tokens: 0 },
};
const head: ItemHead = {
  id: "req_1",
  status: 200,
  headers: { "content-type": "text/event-stream" },
};

/** A body that yields `chunks` one read each, as an origin's HTTP chunks arrive. */
function body(chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  let at = 0;
  return new ReadableStream({
    pull(controller) {
      const chunk = chunks[at++];
      if (chunk === undefined) controller.close();
      else controller.enqueue(chunk);
    },
  });
}

describe("an open item's DATA", () => {
  it("leaves joined when frames arrive in one chunk, with the same bytes and order", async () => {
    const item = openItemFromFrames(
      head,
      frameReader(
        body([
          concatBytes([data("data: a\n\n"), data("data: b\n\n"), data("data: c\n\n")]),
          concatBytes([data("data: d\n\n"), encodeJsonFrame(FrameType.END, 0, trailer)]),
        ]),
      ),
      () => {},
    );
    const events = [await item.next(), await item.next(), await item.next()];
    expect(events.map((e) => (e.kind === "data" ? decoder.decode(e.bytes) : e.kind))).toEqual([
      "data: a\n\ndata: b\n\ndata: c\n\n",
      "data: d\n\n",
      "end",
    ]);
    expect(events[2]).toEqual({ kind: "end", trailer });
  });

  it("is not held back for frames that have not arrived", async () => {
    let release: (() => void) | undefined;
    const later = new Promise<void>((resolve) => {
      release = resolve;
    });
    let reads = 0;
    const slow = new ReadableStream<Uint8Array>({
      async pull(controller) {
        reads += 1;
        if (reads === 1) controller.enqueue(data("data: first\n\n"));
        else {
          await later;
          controller.enqueue(encodeJsonFrame(FrameType.END, 0, trailer));
          controller.close();
        }
      },
    });
    const item = openItemFromFrames(head, frameReader(slow), () => {});
    const first = await item.next();
    expect(first.kind === "data" && decoder.decode(first.bytes)).toBe("data: first\n\n");
    release?.();
    expect((await item.next()).kind).toBe("end");
  });

  it("stops at a LOAD frame between DATA frames and reports it", async () => {
    const loads: unknown[] = [];
    const load = { running: 1, waiting: 0 };
    const item = openItemFromFrames(
      head,
      frameReader(
        body([
          concatBytes([
            data("x"),
            encodeJsonFrame(FrameType.LOAD, 0xffff, load),
            data("y"),
            encodeJsonFrame(FrameType.END, 0, trailer),
          ]),
        ]),
      ),
      () => {},
      (report) => loads.push(report),
    );
    const texts: string[] = [];
    for (;;) {
      const event = await item.next();
      if (event.kind !== "data") break;
      texts.push(decoder.decode(event.bytes));
    }
    expect(texts).toEqual(["x", "y"]);
    expect(loads).toEqual([load]);
  });
});

describe("a client that goes away while a read waits", () => {
  it("gets the END's usage: the drain reads behind the waiting read, never beside it", async () => {
    // A system stream, as an origin's response body is: it refuses a second pending read,
    // and holds nothing (each write lands only as it is read).
    const { readable, writable } = new IdentityTransformStream();
    const writer = writable.getWriter();
    // The origin cancels the item: a last token, then the END with the usage so far.
    const originCancels = () => {
      void writer.write(data("data: last\n\n"));
      void writer.write(encodeJsonFrame(FrameType.END, 0, { ...trailer, outcome: "cancelled" }));
      return Promise.resolve();
    };
    const item = openItemFromFrames(
      head,
      frameReader(readable),
      () => {},
      undefined,
      originCancels,
    );
    // The body's pull, waiting for the next frame when the client leaves.
    const waiting = item.next();
    const usage = await item.cancelForUsage(1_000);
    expect(usage).toEqual({ ...trailer, outcome: "cancelled" });
    const event = await waiting;
    expect(event.kind === "data" && decoder.decode(event.bytes)).toBe("data: last\n\n");
  });
});
