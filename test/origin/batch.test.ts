import { afterEach, describe, expect, it } from "vitest";
import { BATCH_CANCEL_PATH, type BatchItem } from "../../contracts/protocol/schema.ts";
import { BATCH_CONTENT_TYPE } from "../../contracts/protocol/framing.ts";
import {
  ITEM_BODY_ENVELOPE_CONTENT_TYPE,
  encodeEnvelope,
} from "../../contracts/protocol/envelope.ts";
import { startOrigin } from "../../origin/server.ts";
import type { OriginOptions, RunningOrigin } from "../../origin/server.ts";
import { eventually, itemText, postBatch, readBatch } from "./batch-client.ts";
import { createFakeEngine, type FakeEngine } from "./fake-engine.ts";

let origin: RunningOrigin | undefined;
let engine: FakeEngine;

async function start(extra: Partial<OriginOptions> = {}): Promise<RunningOrigin> {
  engine = createFakeEngine();
  origin = await startOrigin({ engine, originId: "o-test", region: "eu", port: 0, ...extra });
  return origin;
}

afterEach(async () => {
  await origin?.close();
  origin = undefined;
});

function chat(
  id: string,
  body: Record<string, unknown>,
  extra: Partial<BatchItem> = {},
): BatchItem {
  return {
    id,
    path: "/v1/chat/completions",
    body: JSON.stringify({ model: "fake-model", messages: [], ...body }),
    ...extra,
  };
}

describe("POST /v1/batch", () => {
  it("answers 200 with the batch media type and streams HEAD, DATA, END once per item", async () => {
    const { url } = await start();
    const response = await postBatch(url, "b1", [
      chat("a", { stream: true, max_tokens: 4 }),
      chat("b", { stream: true, max_tokens: 2 }),
      chat("c", { stream: false, max_tokens: 3 }),
    ]);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe(BATCH_CONTENT_TYPE);
    const result = await readBatch(response);
    expect(result.items.size).toBe(3);
    for (const item of result.items.values()) {
      expect(item.order[0]).toBe("HEAD");
      expect(item.order.at(-1)).toBe("END");
      expect(item.order.filter((k) => k === "HEAD")).toHaveLength(1);
      expect(item.order.filter((k) => k === "END")).toHaveLength(1);
      expect(item.end?.outcome).toBe("ok");
    }
    expect(result.items.get(0)?.data).toHaveLength(5);
    expect(result.items.get(0)?.head?.headers["content-type"]).toBe("text/event-stream");
    expect(result.items.get(2)?.end?.usage).toEqual({
      prompt_tokens: 5,
      completion_tokens: 3,
      total_tokens: 8,
      cached_tokens: 0,
    });
  });

  it("sends a LOAD frame first and last, naming the origin", async () => {
    const { url } = await start({ loadIntervalMs: 5 });
    const result = await readBatch(
      await postBatch(url, "b-load", [chat("a", { stream: true, max_tokens: 3 })]),
    );
    expect(result.sequence[0]).toBe("LOAD");
    expect(result.sequence.at(-1)).toBe("LOAD");
    expect(result.loads.length).toBeGreaterThanOrEqual(2);
    expect(result.loads[0]).toMatchObject({ origin: "o-test", kv_total_blocks: 8, block_size: 16 });
    expect(result.loads.at(-1)?.running).toBe(0);
  });

  it.each([
    [undefined, 7],
    [0.5, 4],
    [0, 8],
  ])(
    "reports in each LOAD the background items it runs at once: its 8 slots less a reserve of %s",
    async (reserve, cap) => {
      const { url } = await start({
        loadIntervalMs: 5,
        ...(reserve !== undefined && { backgroundReserveShare: reserve }),
      });
      const result = await readBatch(
        await postBatch(url, "b-cap", [chat("a", { stream: true, max_tokens: 3 })]),
      );
      expect(result.loads.length).toBeGreaterThanOrEqual(2);
      for (const load of result.loads) expect(load.background_cap).toBe(cap);
    },
  );

  it("gives each item the same bytes the plain route gives the same request", async () => {
    const { url } = await start();
    const body = { model: "fake-model", messages: [], stream: true, max_tokens: 5 };
    const plain = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "same-id" },
      body: JSON.stringify(body),
    });
    const plainText = await plain.text();
    const result = await readBatch(await postBatch(url, "b-same", [chat("same-id", body)]));
    expect(itemText(result.items.get(0))).toBe(plainText);
    expect(plainText).toContain("data: [DONE]");
  });

  it("runs one item whose body follows the envelope as the same item inside it", async () => {
    const { url } = await start();
    // A body laid out over lines, with text beyond ASCII: only the first line feed ends
    // the envelope.
    const text = JSON.stringify(
      { model: "fake-model", messages: [{ role: "user", content: "café ✓" }], max_tokens: 5 },
      null,
      2,
    );
    const item = { id: "same-id", path: "/v1/chat/completions" as const, body: text };
    const inside = await readBatch(await postBatch(url, "b-inside", [item]));
    const encoded = encodeEnvelope({ v: 1, batch_id: "b-after", items: [item] });
    expect(encoded.contentType).toBe(ITEM_BODY_ENVELOPE_CONTENT_TYPE);
    const after = await readBatch(
      await fetch(`${url}/v1/batch`, {
        method: "POST",
        headers: { "content-type": encoded.contentType },
        body: encoded.body,
      }),
    );
    expect(after.items.get(0)?.end?.outcome).toBe("ok");
    expect(itemText(after.items.get(0))).toBe(itemText(inside.items.get(0)));
    expect(engine.bodies).toEqual([text, text]);
  });

  it("fails one item on its own while the others succeed", async () => {
    const { url } = await start();
    const result = await readBatch(
      await postBatch(url, "b-fail", [
        chat("ok-1", { stream: true, max_tokens: 3 }),
        chat("fails", { x_fail: 503 }),
        chat("throws", { x_throw: true }),
        { id: "not-json", path: "/v1/completions", body: "{oops" },
        chat("ok-2", { stream: false, max_tokens: 2 }),
      ]),
    );
    expect(result.items.get(0)?.end?.outcome).toBe("ok");
    expect(result.items.get(4)?.end?.outcome).toBe("ok");
    expect(result.items.get(1)?.head?.status).toBe(503);
    expect(result.items.get(1)?.end).toMatchObject({ outcome: "error", error: { code: "fake" } });
    expect(JSON.parse(itemText(result.items.get(1)))).toMatchObject({ error: { code: "fake" } });
    expect(result.items.get(2)?.head?.status).toBe(500);
    expect(result.items.get(2)?.end).toMatchObject({
      outcome: "error",
      error: { code: "engine_error" },
    });
    expect(result.items.get(3)?.head?.status).toBe(400);
    expect(result.items.get(3)?.end).toMatchObject({
      outcome: "error",
      error: { code: "invalid_json" },
    });
  });

  it("cancels one item mid-stream, frees its slot, and lets the others finish", async () => {
    const { url } = await start();
    const response = await postBatch(url, "b-cancel", [
      chat("long", { stream: true, max_tokens: 100_000 }),
      chat("short", { stream: true, max_tokens: 20, x_tick_ms: 5 }),
    ]);
    let cancelAnswer: Promise<unknown> | undefined;
    const result = await readBatch(response, (kind, item) => {
      if (kind === "DATA" && item === 0 && cancelAnswer === undefined) {
        cancelAnswer = fetch(`${url}${BATCH_CANCEL_PATH}`, {
          method: "POST",
          body: JSON.stringify({ batch_id: "b-cancel", ids: ["long"] }),
        }).then((r) => r.json());
      }
    });
    expect(await cancelAnswer).toEqual({ cancelled: ["long"] });
    expect(result.items.get(0)?.end).toMatchObject({
      outcome: "cancelled",
      error: { code: "item_cancelled" },
    });
    expect(result.items.get(1)?.end?.outcome).toBe("ok");
    expect(itemText(result.items.get(1))).toContain("[DONE]");
    expect(engine.aborted).toEqual(["long"]);
    expect(engine.running()).toBe(0);
  });

  it("answers an empty cancelled list for a batch it does not know", async () => {
    const { url } = await start();
    const response = await fetch(`${url}${BATCH_CANCEL_PATH}`, {
      method: "POST",
      body: JSON.stringify({ batch_id: "nope" }),
    });
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ cancelled: [] });
  });

  it("aborts every unfinished item when the edge drops the batch connection", async () => {
    const { url } = await start();
    const controller = new AbortController();
    const response = await postBatch(
      url,
      "b-drop",
      [
        chat("x", { stream: true, max_tokens: 100_000 }),
        chat("y", { stream: true, max_tokens: 100_000 }),
        chat("z", { stream: false, max_tokens: 100_000 }),
      ],
      controller.signal,
    );
    await expect(
      readBatch(response, (kind) => {
        if (kind === "DATA") controller.abort();
      }),
    ).rejects.toThrow(/abort/i);
    await eventually(() => engine.running() === 0, "every slot freed");
    expect([...engine.aborted].sort()).toEqual(["x", "y", "z"]);
  });

  it("ends an item that runs past timeout_ms with outcome timeout", async () => {
    const { url } = await start();
    const result = await readBatch(
      await postBatch(url, "b-timeout", [
        chat("slow", { stream: true, max_tokens: 100_000 }, { timeout_ms: 30 }),
        chat("fast", { stream: true, max_tokens: 2 }, { timeout_ms: 60_000 }),
      ]),
    );
    expect(result.items.get(0)?.end).toMatchObject({
      outcome: "timeout",
      error: { code: "item_timeout" },
    });
    expect(result.items.get(1)?.end?.outcome).toBe("ok");
    expect(engine.aborted).toEqual(["slow"]);
  });

  it("counts batches, items and cancellations in /metrics", async () => {
    const { url } = await start();
    await readBatch(
      await postBatch(url, "b-m", [
        chat("m1", { stream: true, max_tokens: 1 }),
        chat("m2", { stream: true, max_tokens: 100_000 }, { timeout_ms: 20 }),
      ]),
    );
    const text = await (await fetch(`${url}/metrics`)).text();
    expect(text).toContain("warmgate_origin_batches_total 1");
    expect(text).toContain("warmgate_origin_batch_items_total 2");
    expect(text).toContain("warmgate_origin_items_in_flight 0");
    expect(text).toContain('warmgate_origin_cancellations_total{reason="timeout"} 1');
    expect(text).toContain('warmgate_origin_item_outcomes_total{outcome="ok"} 1');
  });
});

/** Posts a raw batch body and returns the status, the OpenAI error code and type, and param. */
async function envelopeRefusal(body: string, contentType?: string) {
  const { url } = origin ?? (await start({ maxBatchItems: 2 }));
  const headers = contentType === undefined ? undefined : { "content-type": contentType };
  const response = await fetch(`${url}/v1/batch`, { method: "POST", headers, body });
  const json = (await response.json()) as {
    error: { code: string; type: string; param: string | null };
  };
  return [response.status, json.error.code, json.error.type, json.error.param] as const;
}

/** Posts a raw batch body and returns the status and the OpenAI error code. */
async function envelopeError(body: string): Promise<[number, string, string]> {
  const [status, code, type] = await envelopeRefusal(body);
  return [status, code, type];
}

const item = { id: "a", path: "/v1/completions", body: "{}" };

function originUrl(): string {
  if (origin === undefined) throw new Error("no origin started");
  return origin.url;
}

const bareEnvelope = (items: unknown[]) => JSON.stringify({ v: 1, batch_id: "b", items });
const invalidBatch = (param: string) => [400, "invalid_batch", "invalid_request_error", param];

describe("POST /v1/batch envelope errors", () => {
  it("rejects a body that is not JSON", async () => {
    expect(await envelopeError("{")).toEqual([400, "invalid_json", "invalid_request_error"]);
  });
  it("rejects an unknown protocol version", async () => {
    const body = JSON.stringify({ v: 2, batch_id: "b", items: [item] });
    expect(await envelopeError(body)).toEqual([400, "invalid_batch", "invalid_request_error"]);
  });
  it("rejects an item for a path the engine does not serve", async () => {
    const body = JSON.stringify({
      v: 1,
      batch_id: "b",
      items: [{ ...item, path: "/v1/audio/speech" }],
    });
    expect(await envelopeError(body)).toEqual([400, "invalid_batch", "invalid_request_error"]);
  });
  it("rejects an empty batch", async () => {
    const body = JSON.stringify({ v: 1, batch_id: "b", items: [] });
    expect(await envelopeError(body)).toEqual([400, "invalid_batch", "invalid_request_error"]);
  });
  it("rejects more items than the origin accepts", async () => {
    const items = [item, { ...item, id: "b" }, { ...item, id: "c" }];
    const body = JSON.stringify({ v: 1, batch_id: "b", items });
    expect(await envelopeError(body)).toEqual([400, "batch_too_large", "invalid_request_error"]);
  });
  it("rejects duplicate item ids", async () => {
    const body = JSON.stringify({ v: 1, batch_id: "b", items: [item, item] });
    expect(await envelopeError(body)).toEqual([400, "duplicate_item_id", "invalid_request_error"]);
  });

  it("rejects an envelope meant to be followed by its item's body but not so", async () => {
    const type = ITEM_BODY_ENVELOPE_CONTENT_TYPE;
    const { body: _, ...bare } = item;
    const envelope = bareEnvelope;
    expect(await envelopeRefusal(envelope([bare]), type)).toEqual(invalidBatch("items.0.body"));
    expect(await envelopeRefusal(`${envelope([bare, bare])}\n{}`, type)).toEqual(
      invalidBatch("items"),
    );
    expect(await envelopeRefusal(`${envelope([])}\n{}`, type)).toEqual(invalidBatch("items"));
    expect(await envelopeRefusal(`${envelope(["a"])}\n{}`, type)).toEqual(invalidBatch("items"));
    expect(await envelopeRefusal(`${envelope([item])}\n{}`, type)).toEqual(
      invalidBatch("items.0.body"),
    );
    expect(await envelopeRefusal("{\n{}", type)).toEqual([
      400,
      "invalid_json",
      "invalid_request_error",
      null,
    ]);
    // What follows is the item's body as the client sent it: the engine refuses it, not the
    // origin the envelope.
    const result = await readBatch(
      await fetch(`${originUrl()}/v1/batch`, {
        method: "POST",
        headers: { "content-type": type },
        body: `${envelope([{ ...bare, id: "bad-body" }])}\n{oops`,
      }),
    );
    expect(result.items.get(0)?.end).toMatchObject({
      outcome: "error",
      error: { code: "invalid_json" },
    });
  });

  it("rejects a batch id that is already running", async () => {
    const { url } = await start();
    const controller = new AbortController();
    const first = await postBatch(
      url,
      "dup",
      [chat("a", { stream: true, max_tokens: 100_000 })],
      controller.signal,
    );
    const second = await postBatch(url, "dup", [chat("b", {})]);
    expect(second.status).toBe(409);
    expect(((await second.json()) as { error: { code: string } }).error.code).toBe(
      "batch_conflict",
    );
    controller.abort();
    await first.body?.cancel().catch(() => {});
  });
});

const lookupOutcomes = (url: string, ids: string[], token?: string) =>
  fetch(`${url}/v1/batch/outcomes`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
    },
    body: JSON.stringify({ ids }),
  });

describe("POST /v1/batch/outcomes", () => {
  it("tells how the items of a request and its retries ended, with their usage", async () => {
    const { url } = await start();
    await readBatch(
      await postBatch(url, "b-out", [
        chat("req_x", { max_tokens: 3 }),
        chat("req_x.1", { stream: true, max_tokens: 2 }),
        chat("req_y", { max_tokens: 1 }),
      ]),
    );
    const res = await lookupOutcomes(url, ["req_x", "req_unknown"]);
    expect(res.status).toBe(200);
    const { items } = (await res.json()) as { items: { id: string; state: string }[] };
    expect(items.map((found) => found.id).sort()).toEqual(["req_x", "req_x.1"]);
    expect(items[0]).toMatchObject({
      state: "ended",
      outcome: "ok",
      usage: { completion_tokens: 3 },
    });
  });

  it("tells the items of every request whose id starts with a named prefix", async () => {
    const { url } = await start();
    const lease = "req_0123456789abcdef";
    await readBatch(
      await postBatch(url, "b-prefix", [
        chat(`${lease}00000000000000000001`, { max_tokens: 2 }),
        chat(`${lease}00010000000000000002`, { max_tokens: 1 }),
        chat("req_fedcba98765432100000000000000001", { max_tokens: 1 }),
      ]),
    );
    const res = await fetch(`${url}/v1/batch/outcomes`, {
      method: "POST",
      body: JSON.stringify({ ids: [], prefixes: [lease] }),
    });
    expect(res.status).toBe(200);
    const { items } = (await res.json()) as { items: { id: string; state: string }[] };
    expect(items.map((found) => found.id).sort()).toEqual([
      `${lease}00000000000000000001`,
      `${lease}00010000000000000002`,
    ]);
  });

  it("is behind the access token", async () => {
    const { url } = await start({ accessToken: "edge-secret" });
    const refused = await lookupOutcomes(url, ["req_x"]);
    expect(refused.status).toBe(401);
    await refused.arrayBuffer();
    const allowed = await lookupOutcomes(url, ["req_x"], "edge-secret");
    expect(allowed.status).toBe(200);
    expect(await allowed.json()).toEqual({ items: [] });
  });

  it("refuses a malformed lookup with a 400 naming the field", async () => {
    const { url } = await start();
    const res = await fetch(`${url}/v1/batch/outcomes`, {
      method: "POST",
      body: JSON.stringify({ ids: "req_x" }),
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: { param: "ids" } });
  });
});

describe("background items", () => {
  it("answers a background item sent again under its id from the first answer, without running it, and counts no second run", async () => {
    const { url } = await start();
    const line = chat("batch_1-3", { stream: false, max_tokens: 3 }, { background: true });
    const first = await readBatch(await postBatch(url, "b-first", [line]));
    // An edge that restarted before the answer reached its storage sends the line again.
    const again = await readBatch(await postBatch(url, "b-again", [line]));
    expect(itemText(again.items.get(0))).toBe(itemText(first.items.get(0)));
    expect(again.items.get(0)?.end?.outcome).toBe("ok");
    expect(again.items.get(0)?.end?.usage).toEqual(first.items.get(0)?.end?.usage);
    expect(engine.submitted).toEqual(["batch_1-3"]);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain('warmgate_origin_item_outcomes_total{outcome="ok"} 1');
    expect(metrics).toContain("warmgate_origin_items_replayed_total 1");
  });

  it("counts as background runs the lines run to the end, not an interactive item that ended ok nor a line sent again", async () => {
    const { url } = await start();
    const line = chat("batch_1-4", { stream: false, max_tokens: 3 }, { background: true });
    // An interactive stream whose client was cut (the edge died) may still end ok here:
    // the lines' own count must not take it for a line run twice.
    await readBatch(
      await postBatch(url, "b-mixed", [chat("req_2", { stream: true, max_tokens: 3 }), line]),
    );
    await readBatch(await postBatch(url, "b-again", [line]));
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain('warmgate_origin_item_outcomes_total{outcome="ok"} 2');
    expect(metrics).toContain("warmgate_origin_background_ok_runs_total 1");
    expect(metrics).toContain("warmgate_origin_background_rerun_tokens_total 0");
  });

  it("runs an interactive item sent again under its id again", async () => {
    const { url } = await start();
    const request = chat("req_1", { stream: false, max_tokens: 3 });
    await readBatch(await postBatch(url, "b-first", [request]));
    await readBatch(await postBatch(url, "b-again", [request]));
    expect(engine.submitted).toEqual(["req_1", "req_1"]);
  });
});
