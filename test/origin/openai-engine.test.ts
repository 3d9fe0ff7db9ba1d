import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createOpenAIEngine, withPriority } from "../../origin/openai-engine.ts";
import { meanStepMs, parsePrometheus } from "../../origin/engine-metrics.ts";
import { hideInjectedUsage, requestUsage, SseSplitter } from "../../origin/sse-usage.ts";
import { BATCH_CANCEL_PATH } from "../../contracts/protocol/schema.ts";
import { startOrigin } from "../../origin/server.ts";
import type { RunningOrigin } from "../../origin/server.ts";
import { createSimEngine } from "../../origin/sim/engine.ts";
import { eventuallyAsync, itemText, postBatch, readBatch } from "./batch-client.ts";

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | null) => (data === null ? null : new TextDecoder().decode(data));

describe("requestUsage", () => {
  it("asks a stream for usage by inserting stream_options, leaving the rest byte for byte", () => {
    const body = '{"model":"m", "stream":true,"x_unknown":{"a":[1,2.50]}}';
    expect(requestUsage(body)).toEqual({
      body: '{"stream_options":{"include_usage":true},"model":"m", "stream":true,"x_unknown":{"a":[1,2.50]}}',
      injected: true,
    });
  });

  it("keeps the client's other stream options and leaves requests that asked alone", () => {
    const asked = '{"stream":true,"stream_options":{"include_usage":true}}';
    expect(requestUsage(asked)).toEqual({ body: asked, injected: false });
    const other = requestUsage('{"stream":true,"stream_options":{"continuous_usage_stats":false}}');
    expect(JSON.parse(other.body)).toEqual({
      stream: true,
      stream_options: { continuous_usage_stats: false, include_usage: true },
    });
    expect(other.injected).toBe(true);
    const plain = '{"stream":false}';
    expect(requestUsage(plain)).toEqual({ body: plain, injected: false });
  });
  it("forwards a body too deep to serialise again untouched, for the engine to judge", () => {
    const deep = `{"stream":true,"stream_options":{},"x":${"[".repeat(100_000)}${"]".repeat(100_000)}}`;
    expect(requestUsage(deep)).toEqual({ body: deep, injected: false });
  });
});

describe("hideInjectedUsage", () => {
  it("drops the usage-only chunk", () => {
    const event = bytes(
      'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n',
    );
    expect(hideInjectedUsage(event)).toBeNull();
  });

  it("removes the usage:null field, wherever it sits, and nothing else", () => {
    expect(
      text(
        hideInjectedUsage(
          bytes(
            'data: {"id":"x","choices":[{"delta":{"content":"\\"usage\\":null"}}],"usage":null}\n\n',
          ),
        ),
      ),
    ).toBe('data: {"id":"x","choices":[{"delta":{"content":"\\"usage\\":null"}}]}\n\n');
    expect(text(hideInjectedUsage(bytes('data: {"usage": null, "id": "x"}\n\n')))).toBe(
      'data: {"id": "x"}\n\n',
    );
    const untouched = bytes('data: {"id":"x","choices":[]}\n\n');
    expect(hideInjectedUsage(untouched)).toBe(untouched);
  });
});

describe("SseSplitter", () => {
  it("cuts a byte stream into whole events wherever the chunks break", () => {
    const stream = "data: a\n\ndata: b\r\n\r\ndata: [DONE]\n\n";
    const splitter = new SseSplitter();
    const events: string[] = [];
    for (const ch of bytes(stream)) {
      for (const event of splitter.push(new Uint8Array([ch]))) events.push(text(event) ?? "");
    }
    expect(events).toEqual(["data: a\n\n", "data: b\r\n\r\n", "data: [DONE]\n\n"]);
    expect(splitter.flush().byteLength).toBe(0);
  });
});

describe("parsePrometheus", () => {
  it("sums a family across label sets and keeps the first label set", () => {
    const scrape = parsePrometheus(
      '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="a"} 2\nvllm:num_requests_running{model_name="b"} 3\nvllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n',
    );
    expect(scrape.sums.get("vllm:num_requests_running")).toBe(5);
    expect(scrape.labels.get("vllm:cache_config_info")).toEqual({
      block_size: "16",
      num_gpu_blocks: "100",
    });
  });
});

// Inter-token latency counters as an engine publishes them, split over two label sets.
const itlScrape = (count: number, sum: number, family = "vllm:inter_token_latency_seconds") =>
  parsePrometheus(
    `${family}_count{model_name="a"} ${count / 2}\n${family}_count{model_name="b"} ${count / 2}\n${family}_sum{model_name="a"} ${sum}\n`,
  );

describe("meanStepMs", () => {
  it("is the mean inter-token latency of the tokens between two scrapes, in ms", () => {
    expect(meanStepMs(itlScrape(100, 2), itlScrape(300, 6))).toBeCloseTo(20, 9);
    expect(
      meanStepMs(
        itlScrape(10, 1, "vllm:time_per_output_token_seconds"),
        itlScrape(20, 1.5, "vllm:time_per_output_token_seconds"),
      ),
    ).toBeCloseTo(50, 9);
  });

  it("knows nothing without a scrape before, tokens between or after an engine restart", () => {
    expect(meanStepMs(null, itlScrape(300, 6))).toBeNull();
    expect(meanStepMs(itlScrape(300, 6), itlScrape(300, 6))).toBeNull();
    expect(meanStepMs(itlScrape(300, 6), itlScrape(20, 0.4))).toBeNull();
    expect(
      meanStepMs(parsePrometheus("vllm:num_requests_running 1\n"), itlScrape(2, 1)),
    ).toBeNull();
  });
});

describe("the openai engine in front of a simulated origin", () => {
  let engineOrigin: RunningOrigin;
  let origin: RunningOrigin;
  const model = "warmgate-sim-8b";

  beforeAll(async () => {
    engineOrigin = await startOrigin({
      engine: createSimEngine({ timeScale: 0.01, seed: 3, deterministic: true }),
      originId: "engine",
    });
    const engine = createOpenAIEngine({ url: engineOrigin.url, metricsIntervalMs: 10 });
    const health = await engine.health();
    if (!health.ok) throw new Error(`engine origin not reachable: ${health.detail ?? ""}`);
    origin = await startOrigin({ engine, originId: "front" });
  });

  afterAll(async () => {
    await origin.close();
    await engineOrigin.close();
  });

  const chat = (content: string, extra: Record<string, unknown> = {}) =>
    JSON.stringify({
      model,
      messages: [{ role: "user", content }],
      max_tokens: 8,
      ...extra,
    });

  async function both(path: string, body: string): Promise<[string, string]> {
    const direct = await fetch(`${engineOrigin.url}${path}`, { method: "POST", body });
    const forwarded = await fetch(`${origin.url}${path}`, { method: "POST", body });
    return [await direct.text(), await forwarded.text()];
  }

  it("lists the engine's models with their context windows", async () => {
    const list = (await (await fetch(`${origin.url}/v1/models`)).json()) as {
      data: { id: string; max_model_len: number }[];
    };
    expect(list.data.map((m) => [m.id, m.max_model_len])).toContainEqual([model, 32768]);
  });

  it("gives a stream without include_usage the exact bytes the engine gives it directly", async () => {
    const [direct, forwarded] = await both(
      "/v1/chat/completions",
      chat("Tell me about tides.", { stream: true }),
    );
    expect(forwarded).toBe(direct);
    expect(direct).not.toContain('"usage"');
    expect(direct).toContain("data: [DONE]");
  });

  it("passes a stream that asked for usage, and a JSON completion, through unchanged", async () => {
    const [direct, forwarded] = await both(
      "/v1/chat/completions",
      chat("Tell me about rivers.", { stream: true, stream_options: { include_usage: true } }),
    );
    expect(forwarded).toBe(direct);
    expect(direct).toContain('"choices":[],"usage":{');
    const [directJson, forwardedJson] = await both(
      "/v1/completions",
      JSON.stringify({ model, prompt: "Once upon a time", max_tokens: 5 }),
    );
    expect(forwardedJson).toBe(directJson);
  });

  it("learns usage and rising cached_tokens from streams whose client did not ask for usage", async () => {
    const prompt = "A long shared system prompt about the history of maritime navigation. ".repeat(
      8,
    );
    const body = chat(prompt, { stream: true });
    const first = await readBatch(
      await postBatch(origin.url, "u1", [{ id: "u1", path: "/v1/chat/completions", body }]),
    );
    const second = await readBatch(
      await postBatch(origin.url, "u2", [{ id: "u2", path: "/v1/chat/completions", body }]),
    );
    const usage1 = first.items.get(0)?.end?.usage;
    const usage2 = second.items.get(0)?.end?.usage;
    expect(usage1?.completion_tokens).toBe(8);
    expect(usage1?.prompt_tokens).toBeGreaterThan(100);
    expect(usage2?.cached_tokens).toBeGreaterThan(usage1?.cached_tokens ?? 0);
    expect(itemText(first.items.get(0))).not.toContain('"usage"');
    const direct = await (
      await fetch(`${engineOrigin.url}/v1/chat/completions`, { method: "POST", body })
    ).text();
    expect(itemText(second.items.get(0))).toBe(direct);
  });

  it("reads load from the engine's vLLM metrics", async () => {
    const result = await readBatch(
      await postBatch(origin.url, "load", [
        {
          id: "l",
          path: "/v1/completions",
          body: JSON.stringify({ model, prompt: "hi", max_tokens: 2 }),
        },
      ]),
    );
    const load = result.loads.at(-1);
    expect(load?.origin).toBe("front");
    expect(load?.prefix_queries).toBeGreaterThan(0);
    const metrics = await (await fetch(`${origin.url}/metrics`)).text();
    expect(metrics).toMatch(/^vllm:num_requests_running\{model_name="warmgate-sim-8b"\} \d+$/m);
  });

  it("cancels a forwarded item mid-stream and the engine stops generating it", async () => {
    const body = chat("Write an endless saga.", { stream: true, max_tokens: 20_000 });
    let cancelled: Promise<unknown> | undefined;
    const result = await readBatch(
      await postBatch(origin.url, "c1", [{ id: "c1", path: "/v1/chat/completions", body }]),
      (kind) => {
        if (kind === "DATA" && cancelled === undefined) {
          cancelled = fetch(`${origin.url}${BATCH_CANCEL_PATH}`, {
            method: "POST",
            body: JSON.stringify({ batch_id: "c1" }),
          }).then((r) => r.json());
        }
      },
    );
    expect(await cancelled).toEqual({ cancelled: ["c1"] });
    expect(result.items.get(0)?.end?.outcome).toBe("cancelled");
    // The engine saw the disconnect: it counts an aborted request and runs nothing.
    let metrics = "";
    await eventuallyAsync(async () => {
      metrics = await (await fetch(`${engineOrigin.url}/metrics`)).text();
      return !/^vllm:num_requests_running\{[^}]*\} [1-9]/m.test(metrics);
    }, "the engine to stop the cancelled sequence");
    expect(metrics).toMatch(
      /^vllm:request_success_total\{model_name="warmgate-sim-8b",finished_reason="abort"\} [1-9]/m,
    );
  });
});

describe("the openai engine without an engine", () => {
  it("answers 502 engine_unreachable and reports it in /health", async () => {
    const gone = await startOrigin({ engine: createSimEngine({ timeScale: 0 }), originId: "gone" });
    const url = gone.url;
    await gone.close();
    const origin = await startOrigin({
      engine: createOpenAIEngine({
        url,
        metricsIntervalMs: 0,
        models: [{ id: "m", max_model_len: 10 }],
      }),
      originId: "lonely",
    });
    try {
      const response = await fetch(`${origin.url}/v1/chat/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", messages: [] }),
      });
      expect(response.status).toBe(502);
      expect(await response.json()).toMatchObject({
        error: { type: "server_error", code: "engine_unreachable" },
      });
      const health = await fetch(`${origin.url}/health`);
      expect(health.status).toBe(503);
      expect(await health.json()).toMatchObject({
        status: "degraded",
        engine: { ok: false, engine: "openai", detail: expect.stringContaining("unreachable") },
      });
    } finally {
      await origin.close();
    }
  });
});

describe("vLLM's priority field", () => {
  it("sends the item's priority negated, since vLLM runs lower values first", () => {
    expect(withPriority('{"model":"m","messages":[]}', 2)).toBe(
      '{"priority":-2,"model":"m","messages":[]}',
    );
  });

  it("leaves the body as it was at priority 0 and when the client set its own", () => {
    expect(withPriority('{"model":"m"}', 0)).toBe('{"model":"m"}');
    expect(withPriority('{"model":"m","priority":5}', 3)).toBe('{"model":"m","priority":5}');
  });
});
