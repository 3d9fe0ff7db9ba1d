import { abortAllDurableObjects, runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { edgeBatching, chat, freshKey, occupy, send } from "../../support/edge-batching.workers.ts";
import { TEST_ADMIN_TOKEN } from "../../support/provided-context.ts";

// edge-batch-2 is this file's alone (about 20 ms per token), so its call counts are ours.
const { ORIGIN_URL, REGION, HOLD, configWith, batcherOf, waitForBatcher } = edgeBatching(
  "edge-batch-2",
  "b3",
);

describe("a JSON answer through the batcher", () => {
  it("comes whole in one answer, byte for byte as its origin answers it alone, with its cost", async () => {
    const config = configWith(HOLD);
    const body = chatBody({ max_tokens: 6, messages: [{ role: "user", content: "Whole." }] });
    const alone = () =>
      fetch(`${ORIGIN_URL}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    // Its prompt's prefix cached first, so both answers report the same cached tokens.
    await (await alone()).arrayBuffer();
    const before = (await batcherOf(config).snapshot()).counters.submitted;
    const { response, done } = send(config, edgeRequest("/v1/chat/completions", { body }));
    const res = await response;
    expect(res.status).toBe(200);
    expect(res.headers.get("x-warmgate-origin")).toBe("edge-batch-2");
    expect(res.headers.get("x-warmgate-cost-usd")).not.toBeNull();
    const direct = await alone();
    expect(new Uint8Array(await res.arrayBuffer())).toEqual(
      new Uint8Array(await direct.arrayBuffer()),
    );
    await done();
    expect((await batcherOf(config).snapshot()).counters.submitted).toBe(before + 1);
  });

  it("is cancelled on its origin when its client goes away, and billed for what it generated", async () => {
    const { auth, settledRows } = await freshKey("json client gone");
    const config = configWith(HOLD);
    const controller = new AbortController();
    const request = new Request(
      edgeRequest("/v1/chat/completions", {
        body: chatBody({ max_tokens: 2000, ignore_eos: true }),
        headers: auth,
      }),
      { signal: controller.signal },
    );
    const { response, done } = send(config, request);
    await waitForBatcher(config, (s) => s.inFlight["edge-batch-2"] === 1);
    await new Promise((resolve) => setTimeout(resolve, 200));
    controller.abort();
    await response.catch(() => null);
    await done();
    const after = await waitForBatcher(config, (s) => s.inFlight["edge-batch-2"] === 0);
    expect(after.inFlight).toEqual({ "edge-batch-2": 0 });
    const [row] = await settledRows(1);
    expect(row).toMatchObject({ state: "settled", outcome: "cancelled" });
    expect(row?.completion_tokens).toBeGreaterThan(0);
    expect(row?.completion_tokens).toBeLessThan(2000);
  });

  it("ends as a 504 timeout at the request's timeout, billed for what it generated", async () => {
    const { auth, settledRows } = await freshKey("json timeout");
    const config = JSON.stringify({
      ...JSON.parse(configWith(HOLD)),
      limits: { first_byte_timeout_ms: 5_000, request_timeout_ms: 400, retry_budget: 0 },
    });
    const { response, done } = send(
      config,
      edgeRequest("/v1/chat/completions", {
        body: chatBody({ max_tokens: 2000, ignore_eos: true }),
        headers: auth,
      }),
    );
    const res = await response;
    expect(res.status).toBe(504);
    expect((await res.json<ErrorBody>()).error).toMatchObject({ code: "origin_timeout" });
    await done();
    const [row] = await settledRows(1);
    expect(row).toMatchObject({ state: "settled", outcome: "timeout" });
    expect(row?.completion_tokens).toBeGreaterThan(0);
  });
});

describe("a batcher restart mid-window", () => {
  it("ends every caller once with an error and settles every reservation", async () => {
    const created = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "batcher restart" }),
    });
    const { id: keyId, key } = await created.json<{ id: string; key: string }>();
    const auth = { authorization: `Bearer ${key}` };
    const config = configWith(HOLD);
    const occupier = await occupy(config, auth);
    const waiting = [send(config, chat({}, auth)), send(config, chat({}, auth))];
    await waitForBatcher(config, (s) => s.queued === 2);

    await abortAllDurableObjects();

    // The running stream, whose body the batcher was writing, is cut: its client gets an
    // error (the connection drops, as on a deploy), never a clean end or [DONE]. The waiting
    // ones get one error answer each.
    const rest = new TextDecoder();
    let tail = "";
    let cut: unknown = null;
    try {
      for (;;) {
        const { done, value } = await occupier.reader.read();
        if (done) break;
        tail += rest.decode(value, { stream: true });
      }
    } catch (error) {
      cut = error;
    }
    expect(cut).toBeInstanceOf(Error);
    expect(tail).not.toContain("[DONE]");
    const answers = await Promise.all(waiting.map((w) => w.response));
    for (const res of answers) {
      expect(res.status).toBe(503);
      expect((await res.json<ErrorBody>()).error.code).toBe("no_healthy_origin");
    }
    await Promise.all(waiting.map((w) => w.done()));

    // Every reservation is closed, as an error, and none is left open.
    const account = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(keyId));
    let rows: { state: string; outcome: string | null }[] = [];
    for (let i = 0; i < 200; i++) {
      rows = await runInDurableObject(account, (instance: KeyAccount, state) => {
        instance.flush();
        return state.storage.sql
          .exec<{ state: string; outcome: string | null }>("SELECT state, outcome FROM ledger")
          .toArray();
      });
      if (rows.length === 3 && rows.every((row) => row.state !== "open")) break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect(rows).toEqual([
      { state: "settled", outcome: "error" },
      { state: "settled", outcome: "error" },
      { state: "settled", outcome: "error" },
    ]);
  });
});

// Last: a request sent through the Batcher changes when an idle edge would skip it.
describe("a batcher that lost its settings", () => {
  it("is sent them again by an edge that sent them before, and answers", async () => {
    const config = configWith(HOLD);
    const first = send(config, chat({ stream: false }));
    expect((await first.response).status).toBe(200);
    await first.done();
    // A new incarnation holds no settings; this isolate's calls leave them out.
    await abortAllDurableObjects();
    const again = send(config, chat({ stream: false }));
    const res = await again.response;
    expect(res.status).toBe(200);
    expect(res.headers.get("x-warmgate-origin")).toBe("edge-batch-2");
    await again.done();
    expect((await batcherOf(config).snapshot()).counters.submitted).toBe(1);
  });
});

describe("usage records of batched requests", () => {
  it("lists the region and origin that served a batched request in its usage record", async () => {
    const config = configWith(HOLD);
    for (const stream of [true, false]) {
      const { response, done } = send(config, chat({ stream }));
      const res = await response;
      await res.arrayBuffer();
      await done();
      const id = res.headers.get("x-request-id") ?? "";
      const record = send(config, edgeRequest(`/v1/usage/requests/${id}`));
      expect(await (await record.response).json()).toMatchObject({
        id,
        status: "settled",
        attempts: [{ region: REGION, origin: "edge-batch-2", result: "served" }],
      });
      await record.done();
    }
  });
});
