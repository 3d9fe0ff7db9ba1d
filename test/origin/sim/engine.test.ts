import { afterEach, describe, expect, it } from "vitest";
import { MODEL, call, chat, closeEngines, engine, events } from "./sim-call.ts";
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
