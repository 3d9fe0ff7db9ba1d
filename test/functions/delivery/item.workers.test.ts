import { describe, expect, it } from "vitest";
import { frameReader } from "../../../contracts/upstream.ts";
import { frameItem } from "../../../functions/delivery/item.ts";
import {
  IDLE_LOAD,
  type ItemHead,
  type ItemTrailer,
  type LoadReport,
} from "../../../contracts/protocol/schema.ts";
import {
  FrameType,
  concatBytes,
  encodeFrame,
  encodeJsonFrame,
} from "../../../contracts/protocol/framing.ts";

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

/** A body's reads, as text. */
async function textsOf(stream: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  for await (const chunk of stream) out.push(decoder.decode(chunk));
  return out;
}

describe("an open item's DATA", () => {
  it("leaves joined when frames arrive in one chunk, with the same bytes and order", async () => {
    const item = frameItem(
      head,
      frameReader(
        body([
          concatBytes([data("data: a\n\n"), data("data: b\n\n"), data("data: c\n\n")]),
          concatBytes([data("data: d\n\n"), encodeJsonFrame(FrameType.END, 0, trailer)]),
        ]),
      ),
      { cancel: () => {} },
    );
    const streamed = item.stream(() => {});
    expect(await textsOf(streamed.body)).toEqual([
      "data: a\n\ndata: b\n\ndata: c\n\n",
      "data: d\n\n",
    ]);
    expect(await streamed.ended).toEqual({ kind: "end", trailer });
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
    const item = frameItem(head, frameReader(slow), { cancel: () => {} });
    const streamed = item.stream(() => {});
    const reader = streamed.body.getReader();
    const first = await reader.read();
    expect(decoder.decode(first.value)).toBe("data: first\n\n");
    release?.();
    expect((await reader.read()).done).toBe(true);
    expect((await streamed.ended).kind).toBe("end");
  });

  it("stops at a LOAD frame between DATA frames and reports it", async () => {
    const loads: unknown[] = [];
    const load: LoadReport = {
      ...IDLE_LOAD,
      origin: "o",
      t: 1,
      running: 1,
      max_num_seqs: 1,
    };
    const item = frameItem(
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
      { cancel: () => {}, onLoad: (report) => loads.push(report) },
    );
    expect(await textsOf(item.stream(() => {}).body)).toEqual(["x", "y"]);
    expect(loads).toEqual([load]);
  });
});

describe("an item read whole", () => {
  it("brings its body and its END", async () => {
    const item = frameItem(
      head,
      frameReader(
        body([concatBytes([data("{"), data("}"), encodeJsonFrame(FrameType.END, 0, trailer)])]),
      ),
      { cancel: () => {} },
    );
    const whole = await item.whole();
    expect(decoder.decode(whole.body)).toBe("{}");
    expect(whole.end).toEqual({ kind: "end", trailer });
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
    const item = frameItem(head, frameReader(readable), {
      cancel: () => {},
      cancelUntilEnd: originCancels,
    });
    const streamed = item.stream(() => {});
    // The body's pull, waiting for the next frame when the client leaves.
    const waiting = streamed.body.getReader().read();
    streamed.clientGone();
    expect(await streamed.ended).toEqual({
      kind: "end",
      trailer: { ...trailer, outcome: "cancelled" },
    });
    const event = await waiting;
    expect(decoder.decode(event.value)).toBe("data: last\n\n");
  });
});

describe("a client that cancels its body", () => {
  // A client that disconnects aborts its request's signal, which the response lifecycle
  // hears at once; a body cancelled without it is heard at the origin's next bytes.
  it("is heard at the origin's next bytes: the item is cancelled, its END still read", async () => {
    const { readable, writable } = new IdentityTransformStream();
    const writer = writable.getWriter();
    void writer.write(data("data: a\n\n"));
    const cancelled = { ...trailer, outcome: "cancelled" as const };
    let cancels = 0;
    let told = 0;
    const item = frameItem(head, frameReader(readable), {
      cancel: () => {},
      cancelUntilEnd: () => {
        cancels += 1;
        void writer.write(encodeJsonFrame(FrameType.END, 0, cancelled));
        return Promise.resolve();
      },
    });
    const streamed = item.stream(() => {
      told += 1;
    });
    const reader = streamed.body.getReader();
    expect(decoder.decode((await reader.read()).value)).toBe("data: a\n\n");
    await reader.cancel();
    void writer.write(data("data: b\n\n"));
    expect(await streamed.ended).toEqual({ kind: "end", trailer: cancelled });
    expect({ cancels, told }).toEqual({ cancels: 1, told: 1 });
  });
});

describe("an item whose origin sends a malformed frame", () => {
  const badEnd = encodeJsonFrame(FrameType.END, 0, { id: "req_1", outcome: "done" });
  const badLoad = encodeFrame(FrameType.LOAD, 0xffff, encoder.encode("{not json"));

  it("ends its stream broken, with the origin-error event, never a thrown error", async () => {
    const item = frameItem(head, frameReader(body([data("data: a\n\n"), badEnd])), {
      cancel: () => {},
    });
    const streamed = item.stream(() => {});
    const texts = await textsOf(streamed.body);
    expect(texts[0]).toBe("data: a\n\n");
    expect(JSON.parse(texts[1]?.replace(/^data: /, "") ?? "")).toMatchObject({
      error: { type: "server_error", code: "origin_error" },
    });
    expect(await streamed.ended).toMatchObject({
      kind: "broken",
      detail: expect.stringContaining("malformed END payload"),
    });
  });

  it("ends broken when read whole, for a malformed LOAD as for a malformed END", async () => {
    for (const bad of [badEnd, badLoad]) {
      const item = frameItem(head, frameReader(body([concatBytes([data("{}"), bad])])), {
        cancel: () => {},
      });
      const whole = await item.whole();
      expect(whole.end).toMatchObject({ kind: "broken" });
    }
  });
});
