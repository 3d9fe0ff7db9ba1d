import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { batchingPlan } from "../../../contracts/config/plans.ts";
import { batcherName, laneFor } from "../../../functions/delivery/batcher-plan.ts";
import { type ErrorBody, chatBody, edgeRequest, lastEvent } from "../../support/edge-requests.ts";
import {
  MODEL,
  edgeBatching,
  chat,
  occupy,
  planOf,
  send,
} from "../../support/edge-batching.workers.ts";
import { TEST_ADMIN_TOKEN } from "../../support/provided-context.ts";

// edge-batch-1 is this file's alone (about 20 ms per token), so its call counts are ours.
const { ORIGIN_URL, REGION, HOLD, configWith, batcherOf, waitForBatcher, originCounts, setFaults } =
  edgeBatching("edge-batch-1", "b");

describe("the request path through the batcher", () => {
  it("collapses concurrent requests into one upstream call and streams each its own bytes", async () => {
    const config = configWith({ ...HOLD, max_batch_size: 3 });
    const occupier = await occupy(config);
    const before = await originCounts();
    const contents = ["First.", "Second.", "Third."];
    const responses = await Promise.all(
      contents.map(
        (content) => send(config, chat({ messages: [{ role: "user", content }] })).response,
      ),
    );
    const texts = await Promise.all(responses.map((res) => res.text()));
    const after = await originCounts();
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 3]);
    for (const [i, res] of responses.entries()) {
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("edge-batch-1");
      const direct = await fetch(`${ORIGIN_URL}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(
          chatBody({
            stream: true,
            max_tokens: 4,
            messages: [{ role: "user", content: contents[i] }],
          }),
        ),
      });
      expect(texts[i]).toBe(await direct.text());
    }
    const snapshot = await batcherOf(config).snapshot();
    expect(snapshot.recentBatches.at(-1)).toMatchObject({ reason: "size" });
    // The origin's last load report, as the batcher uses it.
    const report = snapshot.origins["edge-batch-1"];
    expect(report).toMatchObject({ maxNumSeqs: expect.any(Number), stepMs: expect.any(Number) });
    expect(report?.ageMs).toBeGreaterThanOrEqual(0);
    await occupier.release();
  });

  it("answers a full lane with 503 queue_full and retry-after", async () => {
    const config = configWith({ ...HOLD, lanes: [{ max_queue: 1 }], default_lane: 0 });
    const occupier = await occupy(config);
    const waiting = send(config, chat());
    await waitForBatcher(config, (s) => s.queued === 1);
    const { response } = send(config, chat());
    const refused = await response;
    expect(refused.status).toBe(503);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    const body = await refused.json<ErrorBody>();
    expect(body.error).toMatchObject({ type: "server_error", code: "queue_full" });
    await occupier.release();
    expect((await waiting.response).status).toBe(200);
    await (await waiting.response).arrayBuffer();
  });

  it("answers a lane's queue timeout with the lane's status", async () => {
    for (const status of [503, 429] as const) {
      const config = configWith({
        ...HOLD,
        lanes: [{ queue_timeout_ms: 100, refuse_status: status }],
        default_lane: 0,
      });
      const occupier = await occupy(config);
      const res = await send(config, chat()).response;
      expect(res.status).toBe(status);
      expect(res.headers.get("retry-after")).not.toBeNull();
      expect((await res.json<ErrorBody>()).error.code).toBe("queue_timeout");
      await occupier.release();
    }
  });

  it("takes a waiting request out of its lane when its client goes away", async () => {
    const config = configWith({ ...HOLD, default_lane: 0 });
    const occupier = await occupy(config);
    const before = (await batcherOf(config).snapshot()).counters.cancelledWaiting;
    const client = new AbortController();
    const request = new Request(chat(), { signal: client.signal });
    const waiting = send(config, request);
    await waitForBatcher(config, (s) => s.queued === 1);
    client.abort();
    const after = await waitForBatcher(config, (s) => s.queued === 0);
    expect(after.counters.cancelledWaiting).toBe(before + 1);
    await waiting.response.then(
      (res) => res.body?.cancel(),
      () => undefined,
    );
    await waiting.done();
    await occupier.release();
  });

  it("tries no other region for a client that went away while its request waited", async () => {
    const config = JSON.parse(configWith({ ...HOLD, default_lane: 0 }));
    // A second region to fall back to, whose batcher would count the attempt.
    config.regions.push({ id: "b2", origins: [{ id: "b2-1", url: "http://127.0.0.1:9" }] });
    config.limits.retry_budget = 1;
    const twoRegions = JSON.stringify(config);
    const parsed = loadConfig(twoRegions);
    const b2 = parsed.regions[1];
    const b2Plan = b2 === undefined ? null : batchingPlan(parsed, b2, MODEL);
    if (b2Plan === null) throw new Error("no plan for b2");
    const occupier = await occupy(twoRegions);
    const client = new AbortController();
    const waiting = send(twoRegions, new Request(chat(), { signal: client.signal }));
    await waitForBatcher(twoRegions, (s) => s.queued === 1);
    client.abort();
    const res = await waiting.response;
    await res.body?.cancel();
    await waiting.done();
    const fallback = env.BATCHER.getByName(batcherName("b2", MODEL, 0, b2Plan));
    expect((await fallback.snapshot()).counters.submitted).toBe(0);
    // The ledger says the client went away, not that the gateway failed it.
    const id = res.headers.get("x-request-id") ?? "";
    const record = send(twoRegions, edgeRequest(`/v1/usage/requests/${id}`));
    expect(await (await record.response).json()).toMatchObject({
      id,
      status: "settled",
      outcome: "cancelled",
      completion_tokens: null,
    });
    await record.done();
    await occupier.release();
  });

  it("skips the batcher for a lone request while the batcher has had nothing to batch", async () => {
    for (const [bypassMs, submitted] of [
      [60_000, 1],
      [0, 3],
    ] as const) {
      const config = configWith({ ...HOLD, idle_bypass_ms: bypassMs });
      const before = await originCounts();
      const asked = (await batcherOf(config).snapshot()).counters.submitted;
      for (let i = 0; i < 3; i++) {
        const res = await send(config, chat()).response;
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      }
      const after = await originCounts();
      expect([after.batches - before.batches, after.items - before.items]).toEqual([3, 3]);
      const snapshot = await batcherOf(config).snapshot();
      expect(snapshot.counters.submitted - asked).toBe(submitted);
    }
  });

  it("goes straight to the origin, one call per request, where batching is off", async () => {
    const config = configWith({ ...HOLD, overrides: [{ region: REGION, enabled: false }] });
    expect(planOf(config).enabled).toBe(false);
    const before = await originCounts();
    const asked = (await batcherOf(config).snapshot()).counters.submitted;
    const res = await send(config, chat()).response;
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const after = await originCounts();
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 1]);
    expect((await batcherOf(config).snapshot()).counters.submitted).toBe(asked);
  });
});

/** Sets edge-batch-1's injected faults; null clears them. */

describe("a stream whose body the batcher writes", () => {
  it("ends with the batcher's OpenAI error event when the origin cuts the item", async () => {
    const config = configWith({ idle_bypass_ms: 0 });
    const before = (await batcherOf(config).snapshot()).counters.submitted;
    await setFaults({ dropAfterTokens: 2, dropRate: 1 });
    try {
      const { response, done } = send(config, chat({ max_tokens: 20 }));
      const res = await response;
      expect(res.status).toBe(200);
      const text = await res.text();
      await done();
      expect(text).toMatch(/^data: \{"id":"chatcmpl-/);
      expect(lastEvent(text)).toEqual({
        last: {
          error: {
            message: "The origin server failed to process the request.",
            type: "server_error",
            param: null,
            code: "origin_error",
          },
        },
        done: false,
      });
    } finally {
      await setFaults(null);
    }
    expect((await batcherOf(config).snapshot()).counters.submitted).toBe(before + 1);
  });

  it("ends with a timeout error event when the request outlives its timeout", async () => {
    // Its HEAD comes well within 2 s even on a loaded machine; its 2,000 tokens take ~40 s.
    const config = JSON.stringify({
      ...JSON.parse(configWith({ idle_bypass_ms: 0 })),
      limits: { first_byte_timeout_ms: 5_000, request_timeout_ms: 2_000, retry_budget: 0 },
    });
    const { response, done } = send(config, chat({ max_tokens: 2000 }));
    const res = await response;
    expect(res.status).toBe(200);
    const text = await res.text();
    await done();
    const { last, done: finished } = lastEvent(text);
    expect(last).toMatchObject({ error: { type: "server_error", code: "origin_timeout" } });
    expect(finished).toBe(false);
    const after = await waitForBatcher(config, (s) =>
      Object.values(s.inFlight).every((n) => n === 0),
    );
    expect(after.inFlight).toEqual({ "edge-batch-1": 0 });
  });
});

describe("GET /admin/batchers/:region/:model", () => {
  it("shows each shard's counters to the admin, and no one else", async () => {
    const config = configWith({ shards: 2 });
    const url = `http://edge.test/admin/batchers/${REGION}/${MODEL}`;
    const admin = { authorization: `Bearer ${TEST_ADMIN_TOKEN}` };
    const res = await send(config, new Request(url, { headers: admin })).response;
    expect(res.status).toBe(200);
    const body = await res.json<{ enabled: boolean; shards: { name: string; queued: number }[] }>();
    expect(body.enabled).toBe(true);
    expect(body.shards.map((shard) => shard.name)).toEqual([
      batcherName(REGION, MODEL, 0, planOf(config)),
      batcherName(REGION, MODEL, 1, planOf(config)),
    ]);
    expect(body.shards.every((shard) => shard.queued === 0)).toBe(true);
    expect((await send(config, new Request(url)).response).status).toBe(401);
    const missing = await send(config, new Request(`${url}-nope`, { headers: admin })).response;
    expect(missing.status).toBe(404);
  });
});

describe("lanes from tiers and the priority header", () => {
  const plan = planOf(configWith({}));

  it("maps key tiers to the default lanes, and callers without one to the standard lane", () => {
    expect(laneFor(plan, "high", undefined)).toBe(0);
    expect(laneFor(plan, "standard", undefined)).toBe(1);
    expect(laneFor(plan, "low", undefined)).toBe(2);
    expect(laneFor(plan, undefined, undefined)).toBe(1);
  });

  it("lets x-warmgate-priority lower a lane but never raise it", () => {
    expect(laneFor(plan, "high", "low")).toBe(2);
    expect(laneFor(plan, "high", "1")).toBe(1);
    expect(laneFor(plan, "low", "high")).toBe(2);
    expect(laneFor(plan, "standard", "0")).toBe(1);
    expect(laneFor(plan, "standard", "99")).toBe(2);
    expect(laneFor(plan, "standard", "urgent")).toBe(1);
  });

  it("clamps to the lanes a region has", () => {
    const one = planOf(configWith({ lanes: [{}] }));
    expect([laneFor(one, "low", undefined), laneFor(one, undefined, "low")]).toEqual([0, 0]);
  });
});
