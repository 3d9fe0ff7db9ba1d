import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../origin/engine.ts";
import { BATCH_CANCEL_PATH } from "../../contracts/protocol/schema.ts";
import { startOrigin } from "../../origin/server.ts";
import type { RunningOrigin } from "../../origin/server.ts";
import { createSimEngine } from "../../origin/sim/engine.ts";
import { eventually, itemText, postBatch, readBatch } from "./batch-client.ts";

const model = "warmgate-sim-8b";
const chat = (content: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model, messages: [{ role: "user", content }], max_tokens: 12, ...extra });

describe("an origin on the simulated engine", () => {
  let engine: Engine;
  let origin: RunningOrigin;

  beforeAll(async () => {
    engine = createSimEngine({ timeScale: 0.01, seed: 11, deterministic: true });
    origin = await startOrigin({ engine, originId: "sim-1", region: "eu", loadIntervalMs: 20 });
  });
  afterAll(() => origin.close());

  it("gives batch items the bytes the plain routes give the same requests", async () => {
    const bodies = [
      chat("What is a prefix cache?", { stream: true }),
      chat("What is a prefix cache?", { stream: true, stream_options: { include_usage: true } }),
      chat("Name three rivers.", { stream: false }),
      JSON.stringify({ model, prompt: "The quick brown fox", max_tokens: 6, stream: true }),
    ];
    const paths = [
      "/v1/chat/completions",
      "/v1/chat/completions",
      "/v1/chat/completions",
      "/v1/completions",
    ] as const;
    const plain = await Promise.all(
      bodies.map(async (body, i) =>
        (await fetch(`${origin.url}${paths[i]}`, { method: "POST", body })).text(),
      ),
    );
    const result = await readBatch(
      await postBatch(
        origin.url,
        "same-bytes",
        bodies.map((body, i) => ({ id: `i${i}`, path: paths[i] ?? "/v1/completions", body })),
      ),
    );
    bodies.forEach((_, i) => {
      expect(itemText(result.items.get(i))).toBe(plain[i]);
      expect(result.items.get(i)?.end?.outcome).toBe("ok");
    });
    expect(result.items.get(1)?.end?.usage?.completion_tokens).toBe(12);
  });

  it("reports an engine error for one item while the others succeed", async () => {
    const result = await readBatch(
      await postBatch(origin.url, "mixed", [
        { id: "good", path: "/v1/chat/completions", body: chat("Hello", { stream: true }) },
        { id: "bad", path: "/v1/chat/completions", body: chat("Hello", { model: "no-such" }) },
      ]),
    );
    expect(result.items.get(0)?.end?.outcome).toBe("ok");
    expect(result.items.get(1)?.head?.status).toBe(404);
    expect(result.items.get(1)?.end?.outcome).toBe("error");
  });

  it("frees the engine slot of an item cancelled mid-stream", async () => {
    let cancelled: Promise<unknown> | undefined;
    const result = await readBatch(
      await postBatch(origin.url, "cancel-sim", [
        {
          id: "long",
          path: "/v1/chat/completions",
          body: chat("Saga", { stream: true, max_tokens: 20_000 }),
        },
        { id: "short", path: "/v1/chat/completions", body: chat("Haiku", { stream: true }) },
      ]),
      (kind, item) => {
        if (kind === "DATA" && item === 0 && cancelled === undefined) {
          cancelled = fetch(`${origin.url}${BATCH_CANCEL_PATH}`, {
            method: "POST",
            body: JSON.stringify({ batch_id: "cancel-sim", ids: ["long"] }),
          }).then((r) => r.json());
        }
      },
    );
    expect(await cancelled).toEqual({ cancelled: ["long"] });
    expect(result.items.get(0)?.end?.outcome).toBe("cancelled");
    expect(result.items.get(1)?.end?.outcome).toBe("ok");
    expect(engine.load().running).toBe(0);
  });

  it("stops every item of a batch whose connection drops", async () => {
    const controller = new AbortController();
    const response = await postBatch(
      origin.url,
      "drop-sim",
      ["a", "b", "c"].map((id) => ({
        id,
        path: "/v1/chat/completions" as const,
        body: chat(`Saga ${id}`, { stream: true, max_tokens: 20_000 }),
      })),
      controller.signal,
    );
    await expect(
      readBatch(response, (kind) => {
        if (kind === "DATA") controller.abort();
      }),
    ).rejects.toThrow(/abort/i);
    await eventually(
      () => engine.load().running === 0 && engine.load().waiting === 0,
      "slots freed",
    );
    const metrics = await (await fetch(`${origin.url}/metrics`)).text();
    expect(metrics).toContain('warmgate_origin_cancellations_total{reason="client"} 3');
  });
});

describe("npm run origin", () => {
  it("prints its URL, serves a streamed completion, and exits cleanly on SIGTERM", async () => {
    const child = spawn(
      process.execPath,
      ["origin/main.ts", "--engine", "sim", "--time-scale", "0", "--origin-id", "cli-1"],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    const exited = new Promise<number | null>((resolve) => child.once("exit", resolve));
    let output = "";
    const url = await new Promise<string>((resolve, reject) => {
      child.stdout.on("data", (chunk: Buffer) => {
        output += chunk.toString();
        const match = /^warmgate origin sim listening on (http:\/\/127\.0\.0\.1:\d+)$/m.exec(
          output,
        );
        if (match?.[1] !== undefined) resolve(match[1]);
      });
      child.once("exit", () => reject(new Error(`origin exited: ${output}`)));
    });
    const body = chat("Hi there", { stream: true, stream_options: { include_usage: true } });
    const text = await (await fetch(`${url}/v1/chat/completions`, { method: "POST", body })).text();
    expect(text).toContain('"prompt_tokens_details":{"cached_tokens":');
    expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
  });
});
