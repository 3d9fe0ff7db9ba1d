import { request as httpRequest } from "node:http";
import { afterEach, describe, expect, it } from "vitest";
import type { GpuMonitor } from "../../origin/gpu.ts";
import { createOriginApp, startOrigin } from "../../origin/server.ts";
import type { OriginOptions, RunningOrigin } from "../../origin/server.ts";
import { eventually } from "./batch-client.ts";
import { createFakeEngine } from "./fake-engine.ts";
import type { FakeEngine } from "./fake-engine.ts";

let origin: RunningOrigin | undefined;
let engine: FakeEngine;

const noGpu: GpuMonitor = {
  snapshot: () => Promise.resolve({ available: false, reason: "nvidia-smi not found" }),
};
const oneGpu: GpuMonitor = {
  snapshot: () =>
    Promise.resolve({
      available: true,
      read_at: 0,
      gpus: [
        {
          index: 0,
          name: "NVIDIA H200",
          utilization_percent: 42,
          memory_used_bytes: 1024,
          memory_total_bytes: 4096,
          temperature_celsius: 55,
          power_watts: null,
        },
      ],
    }),
};

async function start(extra: Partial<OriginOptions> = {}): Promise<RunningOrigin> {
  engine = createFakeEngine();
  origin = await startOrigin({ engine, originId: "o-1", region: "eu", gpu: noGpu, ...extra });
  return origin;
}

afterEach(async () => {
  await origin?.close();
  origin = undefined;
});

function post(url: string, path: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  return fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal,
  });
}

describe("OpenAI routes", () => {
  it("streams chat completion events as the engine wrote them", async () => {
    const { url } = await start();
    const response = await post(url, "/v1/chat/completions", { stream: true, max_tokens: 2 });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("text/event-stream");
    expect(response.headers.get("x-request-id")).toMatch(/^req-/);
    const text = await response.text();
    expect(text).toMatch(
      /^data: \{"id":"req-[^"]+","token":0\}\n\ndata: \{"id":"req-[^"]+","token":1\}\n\ndata: \[DONE\]\n\n$/,
    );
  });

  it("answers a non-streaming completion as JSON and passes the request id through", async () => {
    const { url } = await start();
    const response = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "x-request-id": "rid-7" },
      body: JSON.stringify({ max_tokens: 4 }),
    });
    expect(response.headers.get("x-request-id")).toBe("rid-7");
    expect(await response.json()).toEqual({ id: "rid-7", tokens: 4 });
  });

  it("passes an engine error status and body through unchanged", async () => {
    const { url } = await start();
    const response = await post(url, "/v1/chat/completions", { x_fail: 400 });
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ error: { code: "fake", type: "server_error" } });
  });

  it("answers a body that is not a JSON object with an OpenAI-shaped 400", async () => {
    const { url } = await start();
    const response = await post(url, "/v1/chat/completions", "[1,2]");
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({
      error: {
        message: "The request body must be a JSON object.",
        type: "invalid_request_error",
        param: null,
        code: "invalid_json",
      },
    });
  });

  it("answers an unknown route with an OpenAI-shaped 404", async () => {
    const app = createOriginApp({ engine: createFakeEngine(), originId: "o", gpu: noGpu });
    const response = await app.request("/v1/audio/speech", { method: "POST" });
    expect(response.status).toBe(404);
    expect(await response.json()).toMatchObject({ error: { code: "not_found" } });
  });

  it("aborts the engine item and frees its slot when the client disconnects", async () => {
    const { url } = await start();
    const controller = new AbortController();
    const response = await post(
      url,
      "/v1/chat/completions",
      { stream: true, max_tokens: 100_000 },
      controller.signal,
    );
    const reader = response.body?.getReader();
    await reader?.read();
    controller.abort();
    await eventually(() => engine.running() === 0, "the slot to be freed");
    expect(engine.aborted).toHaveLength(1);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain('warmgate_origin_cancellations_total{reason="client"} 1');
  });

  it("lists models in the OpenAI shape with max_model_len", async () => {
    const { url } = await start();
    const list = await (await fetch(`${url}/v1/models`)).json();
    expect(list).toMatchObject({
      object: "list",
      data: [{ id: "fake-model", object: "model", owned_by: "warmgate", max_model_len: 4096 }],
    });
  });
});

describe("GET /health", () => {
  it("reports the engine, origin, region and that there is no GPU reading", async () => {
    const { url } = await start();
    const response = await fetch(`${url}/health`);
    expect(response.status).toBe(200);
    expect(await response.json()).toMatchObject({
      status: "ok",
      origin: "o-1",
      region: "eu",
      engine: { ok: true, engine: "sim" },
      gpu: { available: false, reason: "nvidia-smi not found" },
      in_flight: 0,
    });
  });

  it("answers 503 when the engine is unhealthy", async () => {
    const fake = createFakeEngine();
    fake.health = () => Promise.resolve({ ok: false, engine: "openai", detail: "down" });
    const app = createOriginApp({ engine: fake, originId: "o", gpu: noGpu });
    const response = await app.request("/health");
    expect(response.status).toBe(503);
    expect(await response.json()).toMatchObject({ status: "degraded", engine: { detail: "down" } });
  });
});

describe("GET /metrics", () => {
  it("joins the engine's vLLM lines and the origin's counters", async () => {
    const { url } = await start();
    await (await post(url, "/v1/chat/completions", { stream: true, max_tokens: 1 })).text();
    const response = await fetch(`${url}/metrics`);
    expect(response.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await response.text();
    expect(text).toContain("vllm:num_requests_running 0");
    expect(text).toContain('warmgate_origin_requests_total{route="chat"} 1');
    expect(text).toContain("warmgate_origin_batches_total 0");
    expect(text).toContain("warmgate_origin_gpu_available 0");
    expect(text).toContain('warmgate_origin_gpu_unavailable_info{reason="nvidia-smi not found"} 1');
    expect(text).not.toContain("warmgate_origin_gpu_utilization_percent{");
    expect(text.endsWith("\n")).toBe(true);
  });

  it("adds GPU gauges when nvidia-smi readings exist, skipping unread fields", async () => {
    const app = createOriginApp({ engine: createFakeEngine(), originId: "o", gpu: oneGpu });
    const text = await (await app.request("/metrics")).text();
    expect(text).toContain(
      'warmgate_origin_gpu_utilization_percent{gpu="0",name="NVIDIA H200"} 42',
    );
    expect(text).toContain(
      'warmgate_origin_gpu_memory_total_bytes{gpu="0",name="NVIDIA H200"} 4096',
    );
    expect(text).not.toContain("warmgate_origin_gpu_power_watts{");
    // DCGM-exporter's names for the same readings (memory in MiB).
    expect(text).toContain('DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA H200"} 42');
    expect(text).toContain("# TYPE DCGM_FI_DEV_FB_USED gauge");
  });
});

describe("startOrigin", () => {
  it("listens on a free port and closes open streaming connections on close()", async () => {
    const running = await start();
    expect(running.port).toBeGreaterThan(0);
    expect(running.url).toBe(`http://127.0.0.1:${running.port}`);
    const response = await post(running.url, "/v1/chat/completions", {
      stream: true,
      max_tokens: 100_000,
    });
    await response.body?.getReader().read();
    await running.close();
    origin = undefined;
    expect(engine.running()).toBe(0);
    expect(engine.closed).toBe(true);
    await expect(fetch(`${running.url}/health`)).rejects.toThrow(/fetch failed/);
  });

  it("keeps connections alive between requests", async () => {
    const { port } = await start();
    const sockets = new Set<unknown>();
    const agent = new (await import("node:http")).Agent({ keepAlive: true, maxSockets: 1 });
    for (let i = 0; i < 3; i++) {
      await new Promise<void>((resolve, reject) => {
        const req = httpRequest({ port, path: "/v1/models", agent }, (res) => {
          sockets.add(res.socket);
          res.resume();
          res.on("end", resolve);
        });
        req.on("error", reject);
        req.end();
      });
    }
    agent.destroy();
    expect(sockets.size).toBe(1);
  });
});

describe("access token", () => {
  it("refuses completions and batches without the origin's access token", async () => {
    const { url } = await start({ accessToken: "edge-secret" });
    const completion = await post(url, "/v1/chat/completions", { max_tokens: 2 });
    expect(completion.status).toBe(401);
    expect(((await completion.json()) as { error: { code: string } }).error.code).toBe(
      "invalid_access_token",
    );
    const batch = await post(url, "/v1/batch", { v: 1, batch_id: "b", items: [] });
    expect(batch.status).toBe(401);
  });

  it("serves callers that present the access token, and keeps models and health open", async () => {
    const { url } = await start({ accessToken: "edge-secret" });
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer edge-secret" },
      body: JSON.stringify({ max_tokens: 2 }),
    });
    expect(response.status).toBe(200);
    await response.body?.cancel();
    expect((await fetch(`${url}/v1/models`)).status).toBe(200);
    expect((await fetch(`${url}/health`)).status).toBe(200);
  });
});

describe("GET /metrics behind the access token", () => {
  it("answers 401 without the access token, and 200 with it or the admin token", async () => {
    const { url } = await start({ accessToken: "edge-secret", adminToken: "ops-secret" });
    const scrape = (authorization?: string) =>
      fetch(`${url}/metrics`, { headers: authorization === undefined ? {} : { authorization } });
    const anonymous = await scrape();
    expect(anonymous.status).toBe(401);
    expect(await anonymous.json()).toMatchObject({
      error: { type: "authentication_error", code: "invalid_access_token" },
    });
    expect((await scrape("Bearer wrong")).status).toBe(401);
    const edge = await scrape("Bearer edge-secret");
    expect(edge.status).toBe(200);
    expect(await edge.text()).toContain("warmgate_origin_batches_total 0");
    expect((await scrape("Bearer ops-secret")).status).toBe(200);
  });

  it("keeps /health open, telling status, identity, engine, GPUs, items in flight and uptime", async () => {
    const { url } = await start({ accessToken: "edge-secret" });
    const response = await fetch(`${url}/health`);
    expect(response.status).toBe(200);
    expect(Object.keys((await response.json()) as object).sort()).toEqual([
      "engine",
      "gpu",
      "in_flight",
      "origin",
      "region",
      "status",
      "uptime_s",
    ]);
  });
});
