import { describe, expect, it } from "vitest";
import {
  BATCH_ITEM,
  concatBytes,
  decodeJsonPayload,
  encodeFrame,
  encodeJsonFrame,
  FrameDecoder,
  FramingError,
  FrameType,
  readFrames,
} from "../../contracts/protocol.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

function frames() {
  return [
    encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, { origin: "o", running: 1 }),
    encodeJsonFrame(FrameType.HEAD, 0, { id: "a", status: 200, headers: {} }),
    encodeFrame(FrameType.DATA, 0, bytes('data: {"x":"日本語"}\n\n')),
    encodeFrame(FrameType.DATA, 7, new Uint8Array(0)),
    encodeJsonFrame(FrameType.END, 0, { id: "a", outcome: "ok", usage: null }),
  ];
}

function joined(parts: Uint8Array[]): Uint8Array {
  return new Uint8Array(Buffer.concat(parts));
}

describe("batch framing", () => {
  it("round-trips frames pushed in one chunk", () => {
    const decoded = new FrameDecoder().push(joined(frames()));
    expect(decoded.map((f) => [f.type, f.item])).toEqual([
      [FrameType.LOAD, BATCH_ITEM],
      [FrameType.HEAD, 0],
      [FrameType.DATA, 0],
      [FrameType.DATA, 7],
      [FrameType.END, 0],
    ]);
    expect(new TextDecoder().decode(decoded[2]?.payload)).toBe('data: {"x":"日本語"}\n\n');
    expect(decodeJsonPayload(decoded[4]?.payload ?? new Uint8Array())).toEqual({
      id: "a",
      outcome: "ok",
      usage: null,
    });
  });

  it("decodes the same frames when fed one byte at a time", () => {
    const all = joined(frames());
    const decoder = new FrameDecoder();
    const out = [];
    for (let i = 0; i < all.byteLength; i++) {
      for (const frame of decoder.push(all.subarray(i, i + 1))) {
        out.push({ type: frame.type, item: frame.item, payload: frame.payload.slice() });
      }
    }
    decoder.finish();
    const whole = new FrameDecoder().push(all).map((f) => ({ ...f, payload: f.payload.slice() }));
    expect(out).toEqual(whole);
    expect(decoder.pendingBytes).toBe(0);
  });

  it("reads frames from a stream split at arbitrary points", async () => {
    const all = joined(frames());
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
    const all = joined(frames());
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

describe("concatBytes", () => {
  it("joins chunks in order, and hands a single chunk back without a copy", () => {
    const one = bytes("abc");
    expect(concatBytes([one])).toBe(one);
    expect(concatBytes([one, bytes("de")])).toEqual(bytes("abcde"));
    expect(concatBytes([])).toEqual(new Uint8Array(0));
  });
});
