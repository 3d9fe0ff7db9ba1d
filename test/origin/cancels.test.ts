import { afterEach, describe, expect, it } from "vitest";
import { BATCH_CANCEL_PATH } from "../../contracts/protocol/schema.ts";
import type { BatchItem } from "../../contracts/protocol/schema.ts";
import { CancelMemory } from "../../origin/cancels.ts";
import { startOrigin } from "../../origin/server.ts";
import type { RunningOrigin } from "../../origin/server.ts";
import { postBatch, readBatch } from "./batch-client.ts";
import { createFakeEngine } from "./fake-engine.ts";
import type { FakeEngine } from "./fake-engine.ts";

let origin: RunningOrigin | undefined;
let engine: FakeEngine;

async function start(): Promise<RunningOrigin> {
  engine = createFakeEngine();
  origin = await startOrigin({ engine, originId: "o-test", region: "eu", port: 0 });
  return origin;
}

afterEach(async () => {
  await origin?.close();
  origin = undefined;
});

function chat(id: string, body: Record<string, unknown>): BatchItem {
  return {
    id,
    path: "/v1/chat/completions",
    body: JSON.stringify({ model: "fake-model", messages: [], ...body }),
  };
}

async function cancel(url: string, request: Record<string, unknown>): Promise<unknown> {
  const response = await fetch(`${url}${BATCH_CANCEL_PATH}`, {
    method: "POST",
    body: JSON.stringify(request),
  });
  expect(response.status).toBe(200);
  return response.json();
}

describe("POST /v1/batch/cancel", () => {
  it("stops an item named by its id alone, whatever batch runs it", async () => {
    const { url } = await start();
    const response = await postBatch(url, "b-any", [
      chat("req_long", { stream: true, max_tokens: 100_000 }),
      chat("req_short", { stream: true, max_tokens: 20, x_tick_ms: 5 }),
    ]);
    let answer: Promise<unknown> | undefined;
    const result = await readBatch(response, (kind, item) => {
      if (kind === "DATA" && item === 0) answer ??= cancel(url, { ids: ["req_long"] });
    });
    expect(await answer).toEqual({ cancelled: ["req_long"] });
    expect(result.items.get(0)?.end?.outcome).toBe("cancelled");
    expect(result.items.get(1)?.end?.outcome).toBe("ok");
    expect(engine.aborted).toEqual(["req_long"]);
  });

  it("remembers a cancel that came before its item, which then never reaches the engine", async () => {
    const { url } = await start();
    expect(await cancel(url, { batch_id: "b-late", ids: ["req_early"] })).toEqual({
      cancelled: [],
    });
    const result = await readBatch(
      await postBatch(url, "b-late", [
        chat("req_early", { stream: true, max_tokens: 100_000 }),
        chat("req_other", { stream: true, max_tokens: 2 }),
      ]),
    );
    expect(result.items.get(0)?.head?.status).toBe(499);
    expect(result.items.get(0)?.end).toMatchObject({ outcome: "cancelled", usage: null });
    expect(result.items.get(1)?.end?.outcome).toBe("ok");
    expect(engine.submitted).toEqual(["req_other"]);
  });

  it("remembers a whole batch cancelled before it came", async () => {
    const { url } = await start();
    await cancel(url, { batch_id: "b-gone" });
    const result = await readBatch(
      await postBatch(url, "b-gone", [chat("req_a", { stream: true, max_tokens: 100_000 })]),
    );
    expect(result.items.get(0)?.end?.outcome).toBe("cancelled");
    expect(engine.submitted).toEqual([]);
  });

  it("refuses a cancel that names neither a batch nor an item", async () => {
    const { url } = await start();
    const response = await fetch(`${url}${BATCH_CANCEL_PATH}`, {
      method: "POST",
      body: JSON.stringify({}),
    });
    expect(response.status).toBe(400);
    await response.arrayBuffer();
  });
});

describe("CancelMemory", () => {
  it("forgets a cancel after its retention, and keeps at most its bound", () => {
    const memory = new CancelMemory({ retentionMs: 1_000, maxEntries: 2 });
    memory.remember("a", 0);
    expect(memory.take("a", 999)).toBe(true);
    expect(memory.take("a", 999)).toBe(false);
    memory.remember("b", 0);
    expect(memory.take("b", 1_000)).toBe(false);
    memory.remember("c", 0);
    memory.remember("d", 0);
    memory.remember("e", 0);
    expect(memory.size).toBe(2);
    expect(memory.take("c", 1)).toBe(false);
    expect(memory.take("e", 1)).toBe(true);
  });
});
