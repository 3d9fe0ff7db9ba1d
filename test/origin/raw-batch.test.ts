import { afterEach, describe, expect, it } from "vitest";
import {
  BATCH_PATH,
  type BatchItem,
  OUTCOMES_PATH,
  type ItemRecord,
} from "../../contracts/protocol/schema.ts";
import {
  FrameDecoder,
  FrameType,
  RAW_BATCH_CONTENT_TYPE,
} from "../../contracts/protocol/framing.ts";
import { startOrigin } from "../../origin/server.ts";
import type { OriginOptions, RunningOrigin } from "../../origin/server.ts";
import { eventuallyAsync, itemText, postBatch, readBatch } from "./batch-client.ts";
import { createFakeEngine } from "./fake-engine.ts";

let origin: RunningOrigin | undefined;

async function start(extra: Partial<OriginOptions> = {}): Promise<RunningOrigin> {
  origin = await startOrigin({ engine: createFakeEngine(), originId: "o-raw", port: 0, ...extra });
  return origin;
}

afterEach(async () => {
  await origin?.close();
  origin = undefined;
});

function chat(id: string, body: Record<string, unknown>): BatchItem {
  const json = JSON.stringify({ model: "fake-model", messages: [], stream: true, ...body });
  return { id, path: "/v1/chat/completions", body: json };
}

function postRaw(url: string, batchId: string, items: BatchItem[], signal?: AbortSignal) {
  return fetch(`${url}${BATCH_PATH}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ v: 1, batch_id: batchId, items, raw: true }),
    ...(signal !== undefined && { signal }),
  });
}

/** A raw answer read whole: the frames up to its HEAD, then its body's bytes as text. */
async function readRaw(response: Response) {
  const bytes = new Uint8Array(await response.arrayBuffer());
  const decoder = new FrameDecoder();
  const frames = decoder.push(bytes, true);
  return { frames, body: Buffer.from(decoder.rest()).toString("utf8") };
}

/** An answer's text with its ids and times set aside. */
const same = (text: string) => text.replace(/"id":"[^"]*"/g, "").replace(/\d{10}/g, "T");

async function recordOf(url: string, id: string): Promise<ItemRecord | undefined> {
  const res = await fetch(`${url}${OUTCOMES_PATH}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ids: [id] }),
  });
  const { items } = (await res.json()) as { items: ItemRecord[] };
  return items.find((item) => item.id === id);
}

describe("a raw batch", () => {
  it("sends frames up to the item's HEAD, then its body unframed, byte for byte as a framed batch's DATA", async () => {
    const { url } = await start();
    const raw = await postRaw(url, "r1", [chat("req_raw1", { max_tokens: 4 })]);
    expect(raw.status).toBe(200);
    expect(raw.headers.get("content-type")).toBe(RAW_BATCH_CONTENT_TYPE);
    const { frames, body } = await readRaw(raw);
    expect(frames.map((frame) => frame.type)).toEqual([FrameType.LOAD, FrameType.HEAD]);
    const framed = await readBatch(await postBatch(url, "f1", [chat("req_f1", { max_tokens: 4 })]));
    // Each answer has its own ids and times; the bytes are the same once those are set aside.
    expect(same(body)).toBe(same(itemText(framed.items.get(0))));
    expect(body).toContain("data: [DONE]");
  });

  it("keeps the item's END as its outcome record before the body closes", async () => {
    const { url } = await start();
    await readRaw(await postRaw(url, "r2", [chat("req_raw2", { max_tokens: 3 })]));
    // Asked the moment the body closed: no wait, no retry.
    expect(await recordOf(url, "req_raw2")).toMatchObject({
      state: "ended",
      outcome: "ok",
      usage: { completion_tokens: 3 },
      timing: { ttft_ms: expect.any(Number), total_ms: expect.any(Number) },
    });
  });

  it("breaks the connection of an item cut after its HEAD once its bytes went, its record saying so", async () => {
    const { url } = await start({ faults: { dropAfterTokens: 2, dropRate: 1 } });
    const response = await postRaw(url, "r3", [chat("req_raw3", { max_tokens: 10 })]);
    const reader = response.body!.getReader();
    const chunks: Uint8Array[] = [];
    let broken = false;
    for (;;) {
      try {
        const { done, value } = await reader.read();
        if (done) break;
        chunks.push(value);
      } catch {
        broken = true;
        break;
      }
    }
    // Not a whole body: a reader that piped it cannot take it for a finished answer.
    expect(broken).toBe(true);
    // Its HEAD, then the two events it generated before the cut.
    const decoder = new FrameDecoder();
    expect(decoder.push(Buffer.concat(chunks), true).at(-1)?.type).toBe(FrameType.HEAD);
    expect(
      Buffer.from(decoder.rest())
        .toString("utf8")
        .match(/^data: /gm),
    ).toHaveLength(2);
    expect(await recordOf(url, "req_raw3")).toMatchObject({ state: "ended", outcome: "error" });
  });

  it("cancels its item when the caller closes the call, and records what it generated", async () => {
    const { url } = await start();
    const abort = new AbortController();
    const response = await postRaw(
      url,
      "r4",
      [chat("req_raw4", { max_tokens: 10_000 })],
      abort.signal,
    );
    const reader = response.body!.getReader();
    await reader.read();
    await reader.read();
    abort.abort();
    await eventuallyAsync(
      async () => (await recordOf(url, "req_raw4"))?.state === "ended",
      "the cancelled item's record",
    );
    expect(await recordOf(url, "req_raw4")).toMatchObject({ outcome: "cancelled" });
  });

  it("refuses a raw batch of more than one item with a 400 naming raw", async () => {
    const { url } = await start();
    const res = await postRaw(url, "r5", [chat("a", {}), chat("b", {})]);
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({
      error: { code: "invalid_batch", param: "raw" },
    });
  });
});
