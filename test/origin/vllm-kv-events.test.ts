import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encode } from "@msgpack/msgpack";
import { afterEach, describe, expect, it } from "vitest";
import { Publisher } from "zeromq";
import { promptBlocks } from "../../contracts/prefix-blocks.ts";
import { BATCH_PATH } from "../../contracts/protocol/schema.ts";
import type { EngineBlockEvent } from "../../origin/engine.ts";
import { createOpenAIEngine } from "../../origin/openai-engine.ts";
import { type RunningOrigin, startOrigin } from "../../origin/server.ts";
import { VllmKvEvents } from "../../origin/vllm-kv-events.ts";
import { applyKvEvents, eventuallyAsync, readBatch } from "./batch-client.ts";

// A publisher that speaks vLLM's format (vllm/distributed/kv_events.py): multipart topic,
// 8-byte big-endian sequence, msgpack of KVEventBatch as an array [ts, events, dp_rank],
// each event a tagged array.
class VllmPublisher {
  readonly socket = new Publisher();
  #seq = 0n;
  endpoint = "";

  async bind(): Promise<void> {
    await this.socket.bind("tcp://127.0.0.1:*");
    this.endpoint = this.socket.lastEndpoint ?? "";
  }

  async publish(events: unknown[]): Promise<void> {
    const seq = Buffer.alloc(8);
    seq.writeBigUInt64BE(this.#seq++);
    await this.socket.send(["kv-events", seq, Buffer.from(encode([Date.now() / 1000, events, 0]))]);
  }
}

const TOKENS = Array.from({ length: 100 }, (_, i) => 1000 + i);
const stored = (hashes: unknown[], parent: unknown, tokens: number[]) => [
  "BlockStored",
  hashes,
  parent,
  tokens,
  16,
  null,
  "GPU",
];

let publisher: VllmPublisher | undefined;
let kv: VllmKvEvents | undefined;
let origin: RunningOrigin | undefined;
let upstream: Server | undefined;

afterEach(async () => {
  kv?.close();
  await origin?.close();
  upstream?.close();
  publisher?.socket.close();
  kv = origin = upstream = publisher = undefined;
});

/** Publishes `events` until `seen` says the subscriber has them (ZMQ drops what a late subscriber missed). */
async function publishUntil(events: unknown[], seen: () => boolean): Promise<void> {
  await eventuallyAsync(async () => {
    if (!seen()) await publisher?.publish(events);
    await new Promise((resolve) => setTimeout(resolve, 20));
    return seen();
  }, "the subscriber to receive the events");
}

describe("vLLM KV-cache events", () => {
  it("become block events of the item whose prompt the engine tokenized", async () => {
    publisher = new VllmPublisher();
    await publisher.bind();
    const events: EngineBlockEvent[] = [];
    kv = new VllmKvEvents({ endpoint: publisher.endpoint, tokenize: async () => TOKENS });
    kv.onBlocks((event) => events.push(event));
    kv.track("item-1", "/v1/chat/completions", "{}");
    // 100 tokens: six full blocks, stored in two events (integer and byte hashes).
    const bytes = new Uint8Array(32).fill(7);
    await publishUntil([stored([11, 12, 13], null, TOKENS.slice(0, 48))], () => events.length > 0);
    await publisher.publish([stored([bytes, 15, 16], 13, TOKENS.slice(48, 96))]);
    await eventuallyAsync(async () => events.length >= 2, "the second stored event");
    expect(events.slice(0, 2)).toEqual([
      { kind: "stored", item: "item-1", start: 0, hashes: ["11", "12", "13"], promptBlocks: 6 },
      {
        kind: "stored",
        item: "item-1",
        start: 3,
        hashes: [Buffer.from(bytes).toString("hex"), "15", "16"],
        promptBlocks: 6,
      },
    ]);
    await publisher.publish([["BlockRemoved", [16], "GPU"], ["AllBlocksCleared"]]);
    await eventuallyAsync(async () => events.length >= 4, "the removal and the clear");
    expect(events.slice(2)).toEqual([{ kind: "removed", hashes: ["16"] }, { kind: "cleared" }]);
  });

  it("reach the edge in its own block hashes, through an origin that forwards to vLLM", async () => {
    publisher = new VllmPublisher();
    await publisher.bind();
    // vLLM's OpenAI server as far as the origin uses it: models, tokenize, chat.
    upstream = createServer((req, res) => {
      res.setHeader("content-type", "application/json");
      if (req.url === "/v1/models") {
        res.end(JSON.stringify({ data: [{ id: "m", max_model_len: 4096 }] }));
      } else if (req.url === "/tokenize") {
        res.end(JSON.stringify({ tokens: TOKENS, count: TOKENS.length }));
      } else {
        const usage = { prompt_tokens: 100, completion_tokens: 1, total_tokens: 101 };
        res.end(JSON.stringify({ id: "c", object: "chat.completion", choices: [], usage }));
      }
    });
    await new Promise<void>((resolve) => upstream?.listen(0, "127.0.0.1", resolve));
    const { port } = upstream.address() as AddressInfo;
    const engine = createOpenAIEngine({
      url: `http://127.0.0.1:${port}`,
      metricsIntervalMs: 0,
      kvEvents: { endpoint: publisher.endpoint },
    });
    origin = await startOrigin({ engine, originId: "v", region: "eu", port: 0, loadIntervalMs: 5 });
    const body = {
      model: "m",
      messages: [{ role: "system", content: "You answer questions about invoices. ".repeat(12) }],
    };
    const edge = promptBlocks("m", body);
    const held = new Set<number>();
    let cursor = { log: "", seq: 0 };
    const call = async (id: string) => {
      const response = await fetch(`${origin?.url}${BATCH_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          v: 1,
          batch_id: id,
          items: [{ id, path: "/v1/chat/completions", body: JSON.stringify(body) }],
          kv_events_after: cursor,
        }),
      });
      cursor = applyKvEvents(held, (await readBatch(response)).loads, cursor);
    };
    await call("a");
    // vLLM publishes the prompt's six blocks once it has prefilled them (again until the
    // subscriber has joined: a publisher drops what no subscriber was there for).
    const hashes = [21, 22, 23, 24, 25, 26];
    let n = 0;
    await eventuallyAsync(async () => {
      await publisher?.publish([stored(hashes, null, TOKENS.slice(0, 96))]);
      await call(`b${n++}`);
      return edge.every((hash) => held.has(hash));
    }, "the edge hashes of the prompt to be reported");
    // An eviction of the engine's last block drops the edge blocks it covered.
    await publisher.publish([["BlockRemoved", [26], "GPU"]]);
    await eventuallyAsync(async () => {
      await call(`c${n++}`);
      return !held.has(edge.at(-1) ?? -1);
    }, "the eviction to be reported");
    expect(held.has(edge[0] ?? -1)).toBe(true);
  });
});
