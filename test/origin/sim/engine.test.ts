import { afterEach, describe, expect, it } from "vitest";
import { call, closeEngines, engine, events } from "./sim-call.ts";
import { countTokens } from "../../../origin/sim/tokenizer.ts";

afterEach(closeEngines);

interface ChatJson {
  id: string;
  object: string;
  choices: {
    index: number;
    message: {
      content: string | null;
      tool_calls?: { id: string; function: { name: string; arguments: string } }[];
    };
    finish_reason: string;
  }[];
  usage: {
    prompt_tokens: number;
    completion_tokens: number;
    total_tokens: number;
    prompt_tokens_details: { cached_tokens: number };
  };
}

const MODEL = "warmgate-sim-8b";
const LONG_SYSTEM = "You are the support assistant of a large logistics company. ".repeat(30);
const chat = (extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [
    { role: "system", content: LONG_SYSTEM },
    { role: "user", content: "Where is my parcel?" },
  ],
  max_tokens: 64,
  ...extra,
});

/** The bytes with the cached token count zeroed: the one field that reflects cache state. */
function mask(text: string): string {
  return text.replaceAll(/"cached_tokens":\d+/g, '"cached_tokens":0');
}

describe("simulated engine: determinism", () => {
  it("answers the same request with identical bytes on two engines with the same options", async () => {
    for (const stream of [false, true]) {
      const a = await call(engine({ seed: 9 }), chat({ stream }));
      const b = await call(engine({ seed: 9 }), chat({ stream }));
      expect(a.status).toBe(200);
      expect(a.chunks).toEqual(b.chunks);
    }
  });

  it("answers a repeated request with the same bytes apart from the cached token count", async () => {
    const e = engine();
    for (const body of [chat(), chat({ stream: true, stream_options: { include_usage: true } })]) {
      const first = await call(e, body);
      const second = await call(e, body);
      expect(mask(second.text)).toBe(mask(first.text));
      expect(second.chunks).toHaveLength(first.chunks.length);
    }
  });

  it("writes different text for a different seed, and ignores the seed when sampling greedily", async () => {
    const e = engine();
    const content = async (extra: Record<string, unknown>) =>
      (JSON.parse((await call(e, chat(extra))).text) as ChatJson).choices[0]?.message.content ?? "";
    expect(await content({ seed: 1 })).not.toBe(await content({ seed: 2 }));
    expect(await content({ seed: 1, temperature: 0 })).toBe(
      await content({ seed: 2, temperature: 0 }),
    );
  });

  it("derives the completion id and created from the request, not the clock", async () => {
    const e = engine({ created: 1_800_000_000 });
    const a = JSON.parse((await call(e, chat())).text) as ChatJson & { created: number };
    const b = JSON.parse((await call(e, chat({ seed: 5 }))).text) as ChatJson & { created: number };
    expect(a.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
    expect(a.id).not.toBe(b.id);
    expect(a.created).toBe(1_800_000_000);
  });
});

describe("simulated engine: responses", () => {
  it("answers a chat completion in OpenAI's shape with usage that matches the text", async () => {
    const answer = await call(engine(), chat({ unknown_field: { anything: true } }));
    expect(answer.headers["content-type"]).toBe("application/json");
    const json = JSON.parse(answer.text) as ChatJson;
    expect(json.object).toBe("chat.completion");
    const choice = json.choices[0];
    expect(choice?.message).toMatchObject({ role: "assistant", refusal: null });
    expect(["stop", "length"]).toContain(choice?.finish_reason);
    expect(json.usage.completion_tokens).toBe(countTokens(choice?.message.content ?? ""));
    expect(json.usage.total_tokens).toBe(json.usage.prompt_tokens + json.usage.completion_tokens);
    expect(answer.outcome).toMatchObject({
      outcome: "ok",
      usage: {
        prompt_tokens: json.usage.prompt_tokens,
        completion_tokens: json.usage.completion_tokens,
        cached_tokens: 0,
      },
    });
  });

  it("streams one SSE event per chunk: role first, one token each, finish on the last, then [DONE]", async () => {
    const e = engine();
    const plain = JSON.parse((await call(e, chat({ max_tokens: 20, seed: 3 }))).text) as ChatJson;
    const answer = await call(e, chat({ max_tokens: 20, seed: 3, stream: true }));
    expect(answer.headers).toEqual({
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
    });
    for (const chunk of answer.chunks) expect(chunk).toMatch(/^data: [^\n]+\n\n$/);
    expect(answer.chunks.at(-1)).toBe("data: [DONE]\n\n");
    const chunks = events(answer) as {
      object: string;
      choices: { delta: { role?: string; content?: string }; finish_reason: string | null }[];
      usage?: unknown;
    }[];
    expect(chunks[0]?.choices[0]?.delta).toEqual({ role: "assistant", content: "" });
    const content = chunks.slice(1);
    expect(content).toHaveLength(plain.usage.completion_tokens);
    expect(content.map((c) => c.choices[0]?.delta.content).join("")).toBe(
      plain.choices[0]?.message.content,
    );
    expect(content.slice(0, -1).every((c) => c.choices[0]?.finish_reason === null)).toBe(true);
    expect(content.at(-1)?.choices[0]?.finish_reason).toBe(plain.choices[0]?.finish_reason);
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && !("usage" in c))).toBe(true);
  });

  it("puts usage null on every chunk and a final choices-less usage chunk when include_usage is set", async () => {
    const answer = await call(
      engine({ seed: 2 }),
      chat({ stream: true, stream_options: { include_usage: true } }),
    );
    const chunks = events(answer) as {
      choices: unknown[];
      usage: { completion_tokens: number } | null;
    }[];
    const last = chunks.at(-1);
    expect(last?.choices).toEqual([]);
    expect(last?.usage).toMatchObject({ completion_tokens: chunks.length - 2 });
    expect(chunks.slice(0, -1).every((c) => c.usage === null)).toBe(true);
  });

  it("reports cached prompt tokens rising when the same prompt comes again", async () => {
    const e = engine();
    const first = JSON.parse((await call(e, chat())).text) as ChatJson;
    const second = JSON.parse((await call(e, chat({ seed: 11 }))).text) as ChatJson;
    expect(first.usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect(second.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(
      first.usage.prompt_tokens * 0.9,
    );
    expect(second.usage.prompt_tokens_details.cached_tokens % 16).toBe(0);
    expect(e.load().prefix_hits).toBe(second.usage.prompt_tokens_details.cached_tokens);
  });

  it("cuts the answer at a stop string with finish_reason stop", async () => {
    const e = engine();
    const full = JSON.parse(
      (await call(e, chat({ ignore_eos: true, max_tokens: 100 }))).text,
    ) as ChatJson;
    const text = full.choices[0]?.message.content ?? "";
    const stop = text.split(" ").slice(3, 5).join(" ");
    const cut = JSON.parse(
      (await call(e, chat({ ignore_eos: true, max_tokens: 100, stop: [stop] }))).text,
    ) as ChatJson;
    expect(cut.choices[0]?.message.content).toBe(text.slice(0, text.indexOf(stop)));
    expect(cut.choices[0]?.finish_reason).toBe("stop");
  });

  it("returns n choices with summed completion usage", async () => {
    const json = JSON.parse((await call(engine(), chat({ n: 3 }))).text) as ChatJson;
    expect(json.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(new Set(json.choices.map((c) => c.message.content)).size).toBe(3);
    const sum = json.choices.reduce((s, c) => s + countTokens(c.message.content ?? ""), 0);
    expect(json.usage.completion_tokens).toBe(sum);
  });

  it("streams n choices in the same order every time", async () => {
    const body = chat({ n: 3, stream: true });
    const a = await call(engine(), body);
    const b = await call(engine({ maxNumBatchedTokens: 64 }), body);
    expect(b.chunks).toEqual(a.chunks);
  });

  it("emits a tool call with JSON arguments when tool_choice is required", async () => {
    const tools = [
      {
        type: "function",
        function: {
          name: "track_parcel",
          parameters: {
            type: "object",
            properties: { tracking_id: { type: "string" } },
            required: ["tracking_id"],
          },
        },
      },
    ];
    const e = engine();
    const json = JSON.parse(
      (await call(e, chat({ tools, tool_choice: "required" }))).text,
    ) as ChatJson;
    const choice = json.choices[0];
    expect(choice?.finish_reason).toBe("tool_calls");
    expect(choice?.message.content).toBeNull();
    const toolCall = choice?.message.tool_calls?.[0];
    expect(toolCall?.function.name).toBe("track_parcel");
    expect(JSON.parse(toolCall?.function.arguments ?? "")).toEqual({
      tracking_id: expect.any(String),
    });

    const named = await call(
      e,
      chat({
        tools,
        tool_choice: { type: "function", function: { name: "track_parcel" } },
        stream: true,
      }),
    );
    const chunks = events(named) as {
      choices: {
        delta: { tool_calls?: { function: { name?: string; arguments: string } }[] };
        finish_reason: string | null;
      }[];
    }[];
    const args = chunks
      .flatMap((c) => c.choices[0]?.delta.tool_calls ?? [])
      .map((t) => t.function.arguments)
      .join("");
    expect(JSON.parse(args)).toEqual({ tracking_id: expect.any(String) });
    expect(chunks.at(-1)?.choices[0]?.finish_reason).toBe("tool_calls");
  });

  it("counts tool definitions in the prompt", async () => {
    const e = engine();
    const plain = JSON.parse((await call(e, chat())).text) as ChatJson;
    const tools = [
      { type: "function", function: { name: "noop", description: "Does nothing at all." } },
    ];
    const withTools = JSON.parse((await call(e, chat({ tools }))).text) as ChatJson;
    expect(withTools.usage.prompt_tokens).toBeGreaterThan(plain.usage.prompt_tokens);
  });

  it("writes valid JSON content for response_format json_object", async () => {
    const json = JSON.parse(
      (await call(engine(), chat({ max_tokens: 500, response_format: { type: "json_object" } })))
        .text,
    ) as ChatJson;
    expect(() => JSON.parse(json.choices[0]?.message.content ?? "")).not.toThrow();
  });

  it("answers /v1/completions with text_completion choices for each prompt", async () => {
    const e = engine();
    const answer = await call(
      e,
      { model: MODEL, prompt: ["Once upon a time", "In a galaxy"], max_tokens: 8, n: 2 },
      "/v1/completions",
    );
    const json = JSON.parse(answer.text) as {
      id: string;
      object: string;
      choices: { index: number; text: string }[];
      usage: { prompt_tokens: number };
    };
    expect(json.id).toMatch(/^cmpl-/);
    expect(json.object).toBe("text_completion");
    expect(json.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(json.usage.prompt_tokens).toBe(
      countTokens("Once upon a time") + countTokens("In a galaxy"),
    );
    const streamed = await call(
      e,
      { model: MODEL, prompt: "Once upon a time", max_tokens: 8, stream: true },
      "/v1/completions",
    );
    const chunks = events(streamed) as { object: string; choices: { text: string }[] }[];
    expect(chunks.every((c) => c.object === "text_completion")).toBe(true);
    expect(chunks).toHaveLength(8);
  });
});

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
