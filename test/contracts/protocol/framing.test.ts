import { describe, expect, it } from "vitest";
import {
  BATCH_ITEM,
  type Frame,
  FrameDecoder,
  FrameType,
  FramingError,
  concatBytes,
  decodeFrame,
  encodeFrame,
  encodeJsonFrame,
  parsePayload,
  readFrames,
} from "../../../contracts/protocol/framing.ts";
import { type LoadReport, ItemTrailerSchema } from "../../../contracts/protocol/schema.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

const load: LoadReport = {
  origin: "o",
  t: 1,
  running: 1,
  waiting: 0,
  kv_usage: 0.5,
  kv_free_blocks: 8,
  kv_total_blocks: 16,
  block_size: 16,
  prefix_queries: 0,
  prefix_hits: 0,
  max_num_seqs: 8,
};

function frames() {
  return [
    encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, load),
    encodeJsonFrame(FrameType.HEAD, 0, { id: "a", status: 200, headers: {} }),
    encodeFrame(FrameType.DATA, 0, bytes('data: {"x":"日本語"}\n\n')),
    encodeFrame(FrameType.DATA, 7, new Uint8Array(0)),
    encodeJsonFrame(FrameType.END, 0, { id: "a", outcome: "ok", usage: null }),
  ];
}

/** A frame with its payload copied out of the chunk it arrived in, to compare frames. */
const copied = (frame: Frame): Frame => ({ ...frame, payload: frame.payload.slice() });

describe("batch framing", () => {
  it("round-trips frames pushed in one chunk, each JSON payload read once", () => {
    const decoded = new FrameDecoder().push(concatBytes(frames()));
    expect(decoded.map((f) => [f.type, f.item])).toEqual([
      [FrameType.LOAD, BATCH_ITEM],
      [FrameType.HEAD, 0],
      [FrameType.DATA, 0],
      [FrameType.DATA, 7],
      [FrameType.END, 0],
    ]);
    expect(new TextDecoder().decode(decoded[2]?.payload)).toBe('data: {"x":"日本語"}\n\n');
    expect(decoded[0]).toMatchObject({ report: load });
    expect(decoded[1]).toMatchObject({ head: { id: "a", status: 200, headers: {} } });
    expect(decoded[4]).toMatchObject({ trailer: { id: "a", outcome: "ok", usage: null } });
  });

  it("decodes the same frames when fed one byte at a time", () => {
    const all = concatBytes(frames());
    const decoder = new FrameDecoder();
    const out = [];
    for (let i = 0; i < all.byteLength; i++) {
      for (const frame of decoder.push(all.subarray(i, i + 1))) out.push(copied(frame));
    }
    decoder.finish();
    expect(out).toEqual(new FrameDecoder().push(all).map(copied));
    expect(decoder.pendingBytes).toBe(0);
  });

  it("reads frames from a stream split at arbitrary points", async () => {
    const all = concatBytes(frames());
    const cuts = [3, 9, 10, 40, all.byteLength];
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        let at = 0;
        for (const cut of cuts) {
          controller.enqueue(all.slice(at, cut));
          at = cut;
        }
        controller.close();
      },
    });
    const types = [];
    for await (const frame of readFrames(body)) types.push(frame.type);
    expect(types).toEqual([
      FrameType.LOAD,
      FrameType.HEAD,
      FrameType.DATA,
      FrameType.DATA,
      FrameType.END,
    ]);
  });

  it("refuses a body that ends inside a frame", async () => {
    const all = concatBytes(frames());
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(all.slice(0, all.byteLength - 2));
        controller.close();
      },
    });
    const read = async () => {
      const seen = [];
      for await (const frame of readFrames(body)) seen.push(frame);
      return seen;
    };
    await expect(read()).rejects.toBeInstanceOf(FramingError);
  });

  it("refuses an unknown frame type", () => {
    const bad = encodeFrame(FrameType.DATA, 0, bytes("x"));
    bad[0] = 9;
    expect(() => new FrameDecoder().push(bad)).toThrow(FramingError);
  });
});

describe("a JSON payload that is not its frame's shape", () => {
  it("is bad framing for a HEAD that is not JSON", () => {
    const bad = encodeFrame(FrameType.HEAD, 0, bytes('{"id":"a","status":'));
    expect(() => new FrameDecoder().push(bad)).toThrow("malformed HEAD payload");
  });

  it("is bad framing for an END without its outcome", () => {
    const bad = encodeJsonFrame(FrameType.END, 0, { id: "a", usage: null });
    expect(() => new FrameDecoder().push(bad)).toThrow(FramingError);
  });

  it("is bad framing for an END whose usage is not numbers", () => {
    const usage = { prompt_tokens: "3", completion_tokens: 1, total_tokens: 4, cached_tokens: 0 };
    const bad = encodeJsonFrame(FrameType.END, 0, { id: "a", outcome: "ok", usage });
    expect(() => new FrameDecoder().push(bad)).toThrow(FramingError);
  });

  it("is bad framing for a LOAD that is an array, a string or null", () => {
    for (const value of [[load], "load", null]) {
      const bad = encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, value);
      expect(() => new FrameDecoder().push(bad)).toThrow("malformed LOAD payload");
    }
  });

  it("is bad framing for a HEAD whose status no response can carry", () => {
    for (const status of [0, 101, 600, 200.5]) {
      expect(() =>
        decodeFrame(FrameType.HEAD, 0, bytes(JSON.stringify({ id: "a", status, headers: {} }))),
      ).toThrow(FramingError);
    }
  });

  it("is bad framing for a payload in a frame of another type", () => {
    const head = bytes(JSON.stringify({ id: "a", status: 200, headers: {} }));
    expect(() => decodeFrame(FrameType.END, 0, head)).toThrow("malformed END payload");
  });

  it("leaves DATA alone: its bytes are never parsed", () => {
    const frame = decodeFrame(FrameType.DATA, 3, bytes("{not json"));
    expect(frame).toEqual({ type: FrameType.DATA, item: 3, payload: bytes("{not json") });
  });

  it("is null from parsePayload, which never throws", () => {
    expect(parsePayload(ItemTrailerSchema, bytes("\u0000"))).toBeNull();
    expect(
      parsePayload(ItemTrailerSchema, bytes('{"id":"a","outcome":"maybe","usage":null}')),
    ).toBeNull();
    expect(
      parsePayload(ItemTrailerSchema, bytes('{"id":"a","outcome":"ok","usage":null}')),
    ).toEqual({
      id: "a",
      outcome: "ok",
      usage: null,
    });
  });
});

const noteHead = (value: string) => ({ id: "a", status: 200, headers: { "x-note": value } });

describe("a JSON payload's text", () => {
  it("is read the same short or long, in ASCII or beyond it, and broken UTF-8 is replaced", () => {
    for (const value of ["plain", "日本語 ü", "x".repeat(10_000), `${"y".repeat(5_000)}é`]) {
      const frame = decodeFrame(FrameType.HEAD, 0, bytes(JSON.stringify(noteHead(value))));
      expect(frame.type === FrameType.HEAD && frame.head).toEqual(noteHead(value));
    }
    const broken = concatBytes([
      bytes('{"id":"a","status":200,"headers":{"x":"'),
      new Uint8Array([0xff]),
      bytes('"}}'),
    ]);
    const frame = decodeFrame(FrameType.HEAD, 0, broken);
    expect(frame.type === FrameType.HEAD && frame.head.headers["x"]).toBe("\ufffd");
  });
});

describe("concatBytes", () => {
  it("joins chunks in order, and hands a single chunk back without a copy", () => {
    const one = bytes("abc");
    expect(concatBytes([one])).toBe(one);
    expect(concatBytes([one, bytes("de")])).toEqual(bytes("abcde"));
    expect(concatBytes([])).toEqual(new Uint8Array(0));
  });
});
