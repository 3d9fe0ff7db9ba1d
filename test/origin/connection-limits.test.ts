import { createConnection } from "node:net";
import type { Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { GpuMonitor } from "../../origin/gpu.ts";
import { startOrigin } from "../../origin/server.ts";
import type { OriginListenOptions, RunningOrigin } from "../../origin/server.ts";
import { eventually, eventuallyAsync } from "./batch-client.ts";
import { createFakeEngine } from "./fake-engine.ts";

const noGpu: GpuMonitor = {
  snapshot: () => Promise.resolve({ available: false, reason: "nvidia-smi not found" }),
};

let origin: RunningOrigin | undefined;
const sockets: Socket[] = [];

async function start(limits: OriginListenOptions): Promise<RunningOrigin> {
  origin = await startOrigin({
    engine: createFakeEngine(),
    originId: "o-1",
    gpu: noGpu,
    ...limits,
  });
  return origin;
}

afterEach(async () => {
  for (const socket of sockets.splice(0)) socket.destroy();
  await origin?.close();
  origin = undefined;
});

/** A raw TCP client: what it has received, and whether the server has closed it. */
interface RawClient {
  socket: Socket;
  received(): string;
  closed(): boolean;
}

function connect(port: number): Promise<RawClient> {
  return new Promise((resolve, reject) => {
    const socket = createConnection({ port, host: "127.0.0.1" });
    sockets.push(socket);
    let received = "";
    let closed = false;
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      received += chunk;
    });
    socket.on("close", () => {
      closed = true;
    });
    socket.once("error", reject);
    socket.once("connect", () => {
      // A server that refuses the connection may reset it; `closed` tells that story.
      socket.off("error", reject);
      socket.on("error", () => {});
      resolve({ socket, received: () => received, closed: () => closed });
    });
  });
}

const HEALTH = "GET /health HTTP/1.1\r\nHost: origin\r\n\r\n";

/** The origin's metrics text, or "" while it turns connections away. */
async function metricsOf(url: string): Promise<string> {
  try {
    const answer = await fetch(`${url}/metrics`);
    const text = await answer.text();
    return answer.status === 200 ? text : "";
  } catch {
    return "";
  }
}

describe("the connection cap", () => {
  it("answers a connection beyond --max-connections 503 with retry-after, closes it, and counts it", async () => {
    const { port, url } = await start({ maxConnections: 2 });
    const held = [await connect(port), await connect(port)];
    for (const client of held) {
      client.socket.write(HEALTH);
      await eventually(() => client.received().includes("\r\n\r\n"), "a health answer");
    }
    const third = await connect(port);
    third.socket.write(HEALTH);
    await eventually(() => third.closed(), "the third connection to be closed");
    // Busy, not gone: an HTTP answer the edge tells from a dead origin, as OpenAI's SDKs do.
    const [head = "", body = ""] = third.received().split("\r\n\r\n");
    expect(head).toMatch(/^HTTP\/1\.1 503 /);
    expect(head).toMatch(/^retry-after: 1$/im);
    expect(head).toMatch(/^connection: close$/im);
    expect(JSON.parse(body)).toMatchObject({
      error: { type: "server_error", code: "too_many_connections" },
    });

    // A cap, not a broken server: once a held connection goes, a new one is served.
    held[0]?.socket.destroy();
    let metrics = "";
    await eventuallyAsync(async () => {
      metrics = await metricsOf(url);
      return metrics !== "";
    }, "a free connection slot");
    const busy = /^warmgate_origin_connections_refused_total\{how="busy"\} (\d+)$/m.exec(metrics);
    expect(Number(busy?.[1])).toBeGreaterThanOrEqual(1);
  });

  it("reads a large request body before it answers busy, so the client sees the 503", async () => {
    const { port, url } = await start({ maxConnections: 1 });
    const held = await connect(port);
    held.socket.write(HEALTH);
    await eventually(() => held.received().includes("\r\n\r\n"), "an answer");
    // Closing a socket with unread bytes resets it: a client still sending its body (as a
    // large batch's is, over a real network) would get no answer at all.
    const encoder = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      async start(controller) {
        controller.enqueue(encoder.encode('{"model": "m", "prompt": "'));
        await new Promise((resolve) => setTimeout(resolve, 200));
        controller.enqueue(encoder.encode(`${"x".repeat(1024 * 1024)}"}`));
        controller.close();
      },
    });
    const answer = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
      duplex: "half",
    } as RequestInit);
    expect(answer.status).toBe(503);
    expect(answer.headers.get("retry-after")).toBe("1");
    expect(await answer.json()).toMatchObject({ error: { code: "too_many_connections" } });
  });

  it("closes a connection unanswered past four times the cap, and counts it", async () => {
    const { port, url } = await start({ maxConnections: 1 });
    // One served, three over the cap (waiting to send their requests): four times the cap.
    const held = [await connect(port)];
    held[0]?.socket.write(HEALTH);
    await eventually(() => held[0]?.received().includes("\r\n\r\n") ?? false, "an answer");
    for (let i = 0; i < 3; i++) held.push(await connect(port));
    const fifth = await connect(port);
    fifth.socket.write(HEALTH);
    await eventually(() => fifth.closed(), "the fifth connection to be closed");
    expect(fifth.received()).toBe("");

    for (const client of held) client.socket.destroy();
    let metrics = "";
    await eventuallyAsync(async () => {
      metrics = await metricsOf(url);
      return metrics !== "";
    }, "a free connection slot");
    const closed = /^warmgate_origin_connections_refused_total\{how="closed"\} (\d+)$/m.exec(
      metrics,
    );
    expect(Number(closed?.[1])).toBeGreaterThanOrEqual(1);
  });

  it("closes a connection over the cap that sends no request", async () => {
    const { port } = await start({ maxConnections: 1 });
    const held = await connect(port);
    held.socket.write(HEALTH);
    await eventually(() => held.received().includes("\r\n\r\n"), "an answer");
    const silent = await connect(port);
    await eventually(() => silent.closed(), "the silent connection to be closed");
    expect(silent.received()).toBe("");
  });
});

describe("slow clients", () => {
  it("drops a client that sends its headers slowly once the headers timeout passes", async () => {
    const { port } = await start({ headersTimeoutMs: 100, requestTimeoutMs: 1_000 });
    const client = await connect(port);
    client.socket.write("GET /health HTTP/1.1\r\nHost: origin\r\n");
    // Slowloris: a header line now and then, never the blank line that ends them.
    const dribble = setInterval(() => {
      if (!client.closed()) client.socket.write("X-Slow: 1\r\n");
    }, 20);
    try {
      await eventually(() => client.closed(), "the slow client to be dropped");
    } finally {
      clearInterval(dribble);
    }
    expect(client.received()).toMatch(/^HTTP\/1\.1 408/);
  });

  it("drops a client whose request body trickles past the request timeout", async () => {
    const { port } = await start({ headersTimeoutMs: 50, requestTimeoutMs: 150 });
    const client = await connect(port);
    client.socket.write(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: origin\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    );
    const dribble = setInterval(() => {
      if (!client.closed()) client.socket.write(" ");
    }, 20);
    try {
      await eventually(() => client.closed(), "the slow body to be dropped");
    } finally {
      clearInterval(dribble);
    }
    expect(client.received()).toMatch(/^HTTP\/1\.1 408/);
  });

  it("lets an answer stream on long after the request timeout, once the request is in", async () => {
    const { url } = await start({ headersTimeoutMs: 50, requestTimeoutMs: 100 });
    // Eight tokens 60 ms apart: the answer outlasts the request timeout several times.
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ stream: true, max_tokens: 8, x_tick_ms: 60 }),
    });
    const text = await response.text();
    expect(response.status).toBe(200);
    expect(text.match(/"token":\d+/g)).toHaveLength(8);
    expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
  });

  it("closes an idle keep-alive connection after the keep-alive timeout", async () => {
    const { port } = await start({ keepAliveTimeoutMs: 50 });
    const client = await connect(port);
    client.socket.write(HEALTH);
    await eventually(() => client.closed(), "the idle connection to be closed");
    expect(client.received()).toMatch(/^HTTP\/1\.1 200/);
  });
});

describe("startOrigin", () => {
  it("refuses a request timeout shorter than the headers timeout", async () => {
    await expect(
      startOrigin({
        engine: createFakeEngine(),
        originId: "o",
        gpu: noGpu,
        headersTimeoutMs: 500,
        requestTimeoutMs: 100,
      }),
    ).rejects.toThrow(/request timeout \(100 ms\) must be at least the headers timeout/);
  });
});
