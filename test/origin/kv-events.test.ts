import { afterEach, describe, expect, it } from "vitest";
import { promptBlocks } from "../../contracts/prefix-blocks.ts";
import type { BatchItem, LoadReport } from "../../contracts/protocol/schema.ts";
import { BATCH_PATH } from "../../contracts/protocol/schema.ts";
import { KvEventLog } from "../../origin/kv-events.ts";
import { type RunningOrigin, startOrigin } from "../../origin/server.ts";
import { createSimEngine } from "../../origin/sim/engine.ts";
import { applyKvEvents, readBatch } from "./batch-client.ts";

let origin: RunningOrigin | undefined;

afterEach(async () => {
  await origin?.close();
  origin = undefined;
});

const MODEL = "warmgate-sim-8b";
const system = (n: number) => `You are assistant number ${n} of the support team. `.repeat(60);
const chat = (n: number, question: string) => ({
  model: MODEL,
  max_tokens: 4,
  messages: [
    { role: "system", content: system(n) },
    { role: "user", content: question },
  ],
});

function item(id: string, body: object): BatchItem {
  return { id, path: "/v1/chat/completions", body: JSON.stringify(body) };
}

async function batch(url: string, id: string, items: BatchItem[], after: object) {
  const response = await fetch(`${url}${BATCH_PATH}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ v: 1, batch_id: id, items, kv_events_after: after }),
  });
  return readBatch(response);
}

/** Every LOAD's events of a call, applied in order to a set of hashes. */
function heldAfter(loads: LoadReport[], start: Set<number> = new Set()) {
  const held = new Set(start);
  const cursor = applyKvEvents(held, loads);
  return { held, cursor };
}

describe("block events", () => {
  it("report the prompts the engine cached, in the edge's block hashes, on the call's LOADs", async () => {
    origin = await startOrigin({
      engine: createSimEngine({ timeScale: 0 }),
      originId: "kv",
      region: "eu",
      port: 0,
      loadIntervalMs: 5,
    });
    const result = await batch(origin.url, "b1", [item("a", chat(1, "Hello?"))], {
      log: "",
      seq: 0,
    });
    const { held, cursor } = heldAfter(result.loads);
    const edge = promptBlocks(MODEL, chat(1, "Hello?"));
    expect(edge.length).toBeGreaterThan(40);
    for (const hash of edge) expect(held.has(hash)).toBe(true);
    // A later call from that cursor brings only what changed since.
    const next = await batch(origin.url, "b2", [item("b", chat(2, "Hi"))], cursor);
    const first = next.loads.find((load) => load.kv_events !== undefined)?.kv_events;
    expect(first?.cleared).toBe(false);
    const after = heldAfter(next.loads, held).held;
    for (const hash of promptBlocks(MODEL, chat(2, "Hi"))) expect(after.has(hash)).toBe(true);
  });

  it("report evictions as removals once the cache is full", async () => {
    // 64 blocks of 16 tokens: one prompt of about 700 tokens fits, two do not.
    origin = await startOrigin({
      engine: createSimEngine({ timeScale: 0, kvBlocks: 64 }),
      originId: "kv-small",
      region: "eu",
      port: 0,
      loadIntervalMs: 5,
    });
    const one = await batch(origin.url, "c1", [item("a", chat(1, "Q"))], { log: "", seq: 0 });
    const first = heldAfter(one.loads);
    const two = await batch(origin.url, "c2", [item("b", chat(2, "Q"))], first.cursor);
    const removed = two.loads.flatMap((load) => load.kv_events?.removed ?? []);
    const edge = new Set(promptBlocks(MODEL, chat(1, "Q")));
    expect(removed.length).toBeGreaterThan(0);
    for (const hash of removed) expect(edge.has(hash)).toBe(true);
  });

  it("send no events on calls that do not ask for them", async () => {
    origin = await startOrigin({
      engine: createSimEngine({ timeScale: 0 }),
      originId: "kv-quiet",
      region: "eu",
      port: 0,
    });
    const response = await fetch(`${origin.url}${BATCH_PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ v: 1, batch_id: "q", items: [item("a", chat(1, "Q"))] }),
    });
    const result = await readBatch(response);
    expect(result.loads.every((load) => load.kv_events === undefined)).toBe(true);
  });

  it("give a caller of another log the whole state, and net changes to one that keeps up", () => {
    const log = new KvEventLog();
    log.track("x", JSON.stringify(chat(3, "Q")));
    const edge = promptBlocks(MODEL, chat(3, "Q"));
    log.apply({ kind: "stored", item: "x", start: 0, hashes: [11, 12], promptBlocks: 2 });
    const whole = log.since({ log: "another", seq: 9 });
    expect(whole.cleared).toBe(true);
    expect(new Set(whole.stored)).toEqual(new Set(edge));
    log.apply({ kind: "removed", hashes: [12] });
    const net = log.since({ log: log.id, seq: whole.seq });
    expect(net.cleared).toBe(false);
    expect(net.stored).toEqual([]);
    expect(net.removed).toEqual(edge.slice(Math.floor(edge.length / 2)));
  });
});
