import { afterEach, describe, expect, it } from "vitest";
import { MODEL, call, chat, closeEngines, engine } from "./sim-call.ts";

afterEach(closeEngines);

describe("simulated engine: errors", () => {
  const cases: [string, unknown, number, Record<string, unknown>][] = [
    ["invalid JSON", "{not json", 400, { type: "invalid_request_error", param: null }],
    ["a missing model", { messages: [{ role: "user", content: "hi" }] }, 400, { param: null }],
    [
      "an unknown model",
      { model: "gpt-nope", messages: [{ role: "user", content: "hi" }] },
      404,
      { code: "model_not_found", param: "model" },
    ],
    ["missing messages", { model: MODEL }, 400, { param: "messages" }],
    [
      "a bad role",
      { model: MODEL, messages: [{ role: "robot", content: "hi" }] },
      400,
      { param: "messages[0].role" },
    ],
    ["a bad max_tokens", { ...chat(), max_tokens: -1 }, 400, { param: "max_tokens" }],
    ["n above 128", { ...chat(), n: 500 }, 400, { param: "n" }],
    [
      "stream_options without stream",
      { ...chat(), stream_options: { include_usage: true } },
      400,
      { param: "stream_options" },
    ],
    [
      "a prompt over the context window",
      { model: "warmgate-sim-70b", messages: [{ role: "user", content: "word ".repeat(9000) }] },
      400,
      { code: "context_length_exceeded" },
    ],
    [
      "prompt plus max_tokens over the context window",
      { model: "warmgate-sim-70b", messages: [{ role: "user", content: "hi" }], max_tokens: 8192 },
      400,
      { code: "context_length_exceeded", param: "messages" },
    ],
    [
      "tool_choice naming an unknown function",
      {
        ...chat(),
        tools: [{ type: "function", function: { name: "a" } }],
        tool_choice: { type: "function", function: { name: "b" } },
      },
      400,
      { param: "tool_choice.function.name" },
    ],
  ];
  for (const [what, body, status, error] of cases) {
    it(`answers ${what} with an OpenAI error (${status})`, async () => {
      const answer = await call(engine(), body);
      expect(answer.status).toBe(status);
      expect(answer.headers["content-type"]).toBe("application/json");
      const json = JSON.parse(answer.text) as { error: Record<string, unknown> };
      expect(json.error).toMatchObject({ type: "invalid_request_error", ...error });
      expect(json.error).toHaveProperty("message", expect.any(String));
      expect(answer.outcome).toMatchObject({ outcome: "error", usage: null });
    });
  }

  it("refuses a request that could never fit in KV memory", async () => {
    const answer = await call(engine({ kvBlocks: 4 }), chat({ max_tokens: 10 }));
    expect(answer.status).toBe(400);
    expect(answer.text).toContain("KV cache blocks");
  });
});

describe("simulated engine: cancellation and load", () => {
  it("stops a stream at once when its signal aborts and frees its slot and blocks", async () => {
    const e = engine();
    const controller = new AbortController();
    const response = await e.submit({
      id: "cancel-me",
      path: "/v1/chat/completions",
      body: JSON.stringify(chat({ stream: true, ignore_eos: true, max_tokens: 2000 })),
      headers: {},
      signal: controller.signal,
      priority: 0,
    });
    let seen = 0;
    for await (const chunk of response.body) {
      expect(chunk).toBeInstanceOf(Uint8Array);
      if (++seen === 5) controller.abort();
    }
    const outcome = await response.outcome;
    expect(outcome.outcome).toBe("cancelled");
    expect(outcome.usage?.completion_tokens).toBeGreaterThanOrEqual(4);
    expect(outcome.usage?.completion_tokens).toBeLessThan(2000);
    expect(e.load()).toMatchObject({ running: 0, waiting: 0, kv_usage: 0 });
    expect(e.load().kv_free_blocks).toBe(e.load().kv_total_blocks);
  });

  it("leaks nothing after many cancelled requests, queued or running", async () => {
    const e = engine({ maxNumSeqs: 4, kvBlocks: 512 });
    const runs = Array.from({ length: 40 }, async (_unused, i) => {
      const controller = new AbortController();
      const response = await e.submit({
        id: `c${i}`,
        path: "/v1/chat/completions",
        body: JSON.stringify(
          chat({ seed: i, stream: i % 2 === 0, ignore_eos: true, max_tokens: 500 }),
        ),
        headers: {},
        signal: controller.signal,
        priority: i % 3,
      });
      let chunks = 0;
      if (i % 4 === 0) controller.abort();
      for await (const _ of response.body) {
        if (++chunks >= 1 + (i % 7)) controller.abort();
      }
      if (i % 2 === 1) controller.abort();
      return response.outcome;
    });
    const outcomes = await Promise.all(runs);
    expect(outcomes.every((o) => o.outcome === "cancelled" || o.outcome === "ok")).toBe(true);
    expect(outcomes.some((o) => o.outcome === "cancelled")).toBe(true);
    expect(e.load()).toMatchObject({ running: 0, waiting: 0, kv_usage: 0, kv_free_blocks: 512 });
    expect(e.metrics()).toMatch(
      /vllm:request_success_total\{model_name="warmgate-sim-8b",finished_reason="abort"\} [1-9]/,
    );
  });

  it("cancels the generation when the reader stops reading", async () => {
    const e = engine();
    const response = await e.submit({
      id: "reader-gone",
      path: "/v1/chat/completions",
      body: JSON.stringify(chat({ stream: true, ignore_eos: true, max_tokens: 2000 })),
      headers: {},
      signal: new AbortController().signal,
      priority: 0,
    });
    for await (const _ of response.body) break;
    expect((await response.outcome).outcome).toBe("cancelled");
    expect(e.load()).toMatchObject({ running: 0, waiting: 0 });
  });

  it("reports its recent step time in real milliseconds", async () => {
    const e = engine({ timeScale: 0.5 });
    await call(e, chat({ max_tokens: 20 }));
    // A lone sequence's decode step: 4 ms base and 0.12 ms per sequence, at half speed,
    // plus a little attention; the prompt's own step weighs a fifth and decays.
    const stepMs = e.load().step_ms ?? 0;
    expect(stepMs).toBeGreaterThan(2);
    expect(stepMs).toBeLessThan(3);
  });

  it("reports load, health and vLLM-named metrics", async () => {
    const e = engine({ kvBlocks: 1000, maxNumSeqs: 8 });
    await call(e, chat());
    await call(e, chat({ seed: 4 }));
    expect(e.load()).toMatchObject({
      running: 0,
      waiting: 0,
      kv_total_blocks: 1000,
      kv_free_blocks: 1000,
      block_size: 16,
      max_num_seqs: 8,
    });
    expect(e.load().prefix_hits).toBeGreaterThan(0);
    // Without simulated time, steps take no time to report.
    expect(e.load().step_ms).toBe(0);
    expect(await e.health()).toEqual({
      ok: true,
      engine: "sim",
      detail: "simulated engine: 1000 KV blocks of 16 tokens (simulated GPU memory)",
    });
    const metrics = e.metrics();
    for (const name of [
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:kv_cache_usage_perc",
      "vllm:prefix_cache_queries_total",
      "vllm:prefix_cache_hits_total",
      "vllm:prompt_tokens_total",
      "vllm:generation_tokens_total",
      "vllm:num_preemptions_total",
      "vllm:request_success_total",
    ]) {
      expect(metrics).toContain(`# TYPE ${name} `);
    }
    const generated = Number(
      /vllm:generation_tokens_total\{model_name="warmgate-sim-8b"\} (\d+)/.exec(metrics)?.[1],
    );
    const counts = {
      "vllm:time_to_first_token_seconds": 2,
      "vllm:inter_token_latency_seconds": generated - 2,
      "vllm:e2e_request_latency_seconds": 2,
    };
    for (const [name, count] of Object.entries(counts)) {
      expect(metrics).toContain(`# TYPE ${name} histogram`);
      expect(metrics).toContain(`${name}_count{model_name="${MODEL}"} ${count}\n`);
      expect(metrics).toContain(`${name}_bucket{model_name="${MODEL}",le="+Inf"} ${count}\n`);
    }
    expect(metrics).toMatch(
      new RegExp(
        `vllm:prefix_cache_hits_total\\{model_name="${MODEL}"\\} ${e.load().prefix_hits}\\n`,
      ),
    );
    expect(metrics.endsWith("\n")).toBe(false);
    expect(e.models().map((m) => m.id)).toEqual([
      "warmgate-sim-8b",
      "warmgate-sim-70b",
      "warmgate-sim-embed",
    ]);
  });

  it("ends unfinished requests with an error when the engine closes", async () => {
    const e = engine({ timeScale: 0.01 });
    const response = await e.submit({
      id: "closing",
      path: "/v1/chat/completions",
      body: JSON.stringify(chat({ stream: true, ignore_eos: true, max_tokens: 5000 })),
      headers: {},
      signal: new AbortController().signal,
      priority: 0,
    });
    const reading = (async () => {
      let n = 0;
      for await (const _ of response.body) n++;
      return n;
    })();
    await e.close();
    await reading;
    expect((await response.outcome).outcome).toBe("error");
    expect((await call(e, chat())).status).toBe(503);
  });

  it("runs requests to completion with simulated wall-clock delays", async () => {
    const e = engine({ timeScale: 0.01 });
    const answers = await Promise.all(
      [1, 2, 3].map((seed) => call(e, chat({ seed, max_tokens: 16 }))),
    );
    expect(answers.map((a) => a.outcome.outcome)).toEqual(["ok", "ok", "ok"]);
    expect(answers.every((a) => (a.outcome.ttft_ms ?? -1) >= 0)).toBe(true);
  });
});
