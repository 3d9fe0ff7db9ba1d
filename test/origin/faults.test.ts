import { afterEach, describe, expect, it } from "vitest";
import { createFaultController, DEFAULT_FAULTS, STREAM_DROPPED_CODE } from "../../origin/faults.ts";
import { startOrigin } from "../../origin/server.ts";
import type { OriginOptions, RunningOrigin } from "../../origin/server.ts";
import { eventually, itemText, postBatch, readBatch } from "./batch-client.ts";
import { createFakeEngine } from "./fake-engine.ts";
import type { FakeEngine } from "./fake-engine.ts";

let origin: RunningOrigin | undefined;
let engine: FakeEngine;

async function start(extra: Partial<OriginOptions> = {}): Promise<RunningOrigin> {
  engine = createFakeEngine();
  origin = await startOrigin({ engine, originId: "o-f", ...extra });
  return origin;
}

afterEach(async () => {
  await origin?.close();
  origin = undefined;
});

const streamItem = (id: string, maxTokens = 5) => ({
  id,
  path: "/v1/chat/completions" as const,
  body: JSON.stringify({ stream: true, max_tokens: maxTokens }),
});

function drawFaults(seed: number): string[] {
  const faults = createFaultController({
    seed,
    initial: { errorRate: 0.3, errorStatuses: [429, 500, 503] },
  });
  return Array.from({ length: 50 }, () => JSON.stringify(faults.decide().action));
}

describe("createFaultController", () => {
  it("draws the same faults for the same seed", () => {
    expect(drawFaults(1)).toEqual(drawFaults(1));
    expect(drawFaults(1)).not.toEqual(drawFaults(2));
    expect(new Set(drawFaults(1)).size).toBeGreaterThan(2);
  });

  it("merges partial updates, validates them, and resets to no faults", () => {
    const faults = createFaultController();
    expect(faults.get()).toEqual(DEFAULT_FAULTS);
    expect(faults.set({ latencyMs: 5 })).toMatchObject({ latencyMs: 5, errorRate: 0 });
    expect(() => faults.set({ errorRate: 2 })).toThrow(/errorRate/);
    expect(() => faults.set({ errorStatuses: [404] })).toThrow(/errorStatuses/);
    expect(faults.reset()).toEqual(DEFAULT_FAULTS);
  });
});

describe("fault injection", () => {
  it("answers injected errors with the configured status and an OpenAI-shaped body", async () => {
    const { url, faults } = await start();
    faults.set({ errorRate: 1, errorStatuses: [429] });
    const response = await fetch(`${url}/v1/chat/completions`, { method: "POST", body: "{}" });
    expect(response.status).toBe(429);
    expect(response.headers.get("retry-after")).toBe("1");
    expect(await response.json()).toMatchObject({
      error: { type: "rate_limit_error", code: "origin_fault_injected" },
    });
    expect(engine.submitted).toEqual([]);
  });

  it("ends a dropped batch item with origin_stream_dropped while the batch carries on", async () => {
    const { url } = await start({ faults: { dropAfterTokens: 2 } });
    const result = await readBatch(
      await postBatch(url, "b-drop", [streamItem("a", 10), streamItem("b", 10)]),
    );
    for (const index of [0, 1]) {
      const item = result.items.get(index);
      expect(item?.data).toHaveLength(2);
      expect(item?.end).toMatchObject({ outcome: "error", error: { code: STREAM_DROPPED_CODE } });
      expect(itemText(item)).not.toContain("[DONE]");
    }
    expect(result.sequence.at(-1)).toBe("LOAD");
    expect(engine.running()).toBe(0);
  });

  it("cuts a JSON answer inside its bytes when drops are on", async () => {
    const { url } = await start({ faults: { dropAfterTokens: 3 } });
    const json = { id: "j", path: "/v1/chat/completions" as const, body: '{"max_tokens":5}' };
    const item = (await readBatch(await postBatch(url, "b-json-drop", [json]))).items.get(0);
    expect(itemText(item)).toHaveLength(3);
    expect(item?.end).toMatchObject({ outcome: "error", error: { code: STREAM_DROPPED_CODE } });
    expect(engine.running()).toBe(0);
  });

  it("destroys the connection mid-stream on a plain route", async () => {
    const { url } = await start({ faults: { dropAfterTokens: 1 } });
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ stream: true, max_tokens: 10 }),
    });
    expect(response.status).toBe(200);
    await expect(response.text()).rejects.toThrow(/terminated/);
    await eventually(() => engine.running() === 0, "the dropped item's slot");
  });

  it("hangs an item until its timeout ends it", async () => {
    const { url } = await start({ faults: { hangRate: 1 } });
    const result = await readBatch(
      await postBatch(url, "b-hang", [{ ...streamItem("h"), timeout_ms: 20 }]),
    );
    const item = result.items.get(0);
    expect(item?.head?.status).toBe(504);
    expect(item?.end).toMatchObject({ outcome: "timeout", error: { code: "item_timeout" } });
    expect(engine.submitted).toEqual([]);
  });

  it("adds latency without changing the answer and counts each injection", async () => {
    const { url } = await start({ faults: { latencyMs: 1 } });
    const result = await readBatch(await postBatch(url, "b-lat", [streamItem("l", 2)]));
    expect(result.items.get(0)?.end?.outcome).toBe("ok");
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain('warmgate_origin_fault_injections_total{kind="latency"} 1');
  });
});

describe("/admin/faults", () => {
  it("reads and updates the faults with the admin token", async () => {
    const { url, faults } = await start({ adminToken: "s3cret" });
    const auth = { authorization: "Bearer s3cret" };
    const put = await fetch(`${url}/admin/faults`, {
      method: "PUT",
      headers: auth,
      body: JSON.stringify({ errorRate: 0.5, errorStatuses: [503] }),
    });
    expect(put.status).toBe(200);
    expect(await put.json()).toMatchObject({ errorRate: 0.5, errorStatuses: [503] });
    expect(faults.get().errorRate).toBe(0.5);
    const get = await fetch(`${url}/admin/faults`, { headers: auth });
    expect(await get.json()).toMatchObject({ errorRate: 0.5 });
  });

  it("refuses requests without the admin token", async () => {
    const { url } = await start({ adminToken: "s3cret" });
    const response = await fetch(`${url}/admin/faults`, {
      headers: { authorization: "Bearer nope" },
    });
    expect(response.status).toBe(401);
    expect(await response.json()).toMatchObject({
      error: { type: "authentication_error", code: "invalid_admin_token" },
    });
  });

  it("requires the access token when no admin token is set", async () => {
    const { url } = await start({ accessToken: "edge-secret" });
    const open = await fetch(`${url}/admin/faults`);
    expect(open.status).toBe(401);
    expect(await open.json()).toMatchObject({ error: { code: "invalid_admin_token" } });
    const put = await fetch(`${url}/admin/faults`, {
      method: "PUT",
      headers: { authorization: "Bearer edge-secret" },
      body: JSON.stringify({ errorRate: 1 }),
    });
    expect(put.status).toBe(200);
  });

  it("takes the admin token, not the access token, when both are set", async () => {
    const { url } = await start({ accessToken: "edge-secret", adminToken: "ops-secret" });
    const withAccess = await fetch(`${url}/admin/faults`, {
      headers: { authorization: "Bearer edge-secret" },
    });
    expect(withAccess.status).toBe(401);
    const withAdmin = await fetch(`${url}/admin/faults`, {
      headers: { authorization: "Bearer ops-secret" },
    });
    expect(withAdmin.status).toBe(200);
  });

  it("refuses to listen beyond loopback without an access token", async () => {
    await expect(
      startOrigin({ engine: createFakeEngine(), originId: "o-x", host: "0.0.0.0" }),
    ).rejects.toThrow(/--access-token/);
  });

  it("rejects an invalid fault configuration with a 400 naming the field", async () => {
    const { url } = await start();
    const response = await fetch(`${url}/admin/faults`, {
      method: "PUT",
      body: JSON.stringify({ hangRate: -1 }),
    });
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({
      error: { code: "invalid_fault_config", param: "hangRate" },
    });
  });
});
