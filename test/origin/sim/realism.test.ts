import { afterEach, describe, expect, it } from "vitest";
import { call, closeEngines, engine, events } from "./sim-call.ts";

afterEach(closeEngines);

const MODEL = "warmgate-sim-8b";
const ask = (content: string, extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [{ role: "user", content }],
  max_tokens: 24,
  ...extra,
});

interface Chat {
  id: string;
  created: number;
  choices: {
    message: {
      content: string | null;
      tool_calls?: { function: { name: string; arguments: string } }[];
    };
    logprobs: {
      content: { token: string; logprob: number; bytes: number[]; top_logprobs: unknown[] }[];
    } | null;
    finish_reason: string;
  }[];
}

const json = async (body: unknown, options = {}, path?: Parameters<typeof call>[2]) =>
  JSON.parse((await call(engine(options), body, path)).text) as Chat;

describe("simulated engine: randomness like a model's", () => {
  it("samples anew without a seed: other text and another id each time, created now", async () => {
    const e = engine({ deterministic: false });
    const a = JSON.parse((await call(e, ask("Hi"))).text) as Chat;
    const b = JSON.parse((await call(e, ask("Hi"))).text) as Chat;
    expect(a.id).not.toBe(b.id);
    expect(a.choices[0]?.message.content).not.toBe(b.choices[0]?.message.content);
    expect(Math.abs(a.created - Date.now() / 1000)).toBeLessThan(5);
  });

  it("gives the same bytes for the same seed", async () => {
    // Two engines, so that neither answer has cached tokens the other lacks.
    const options = { deterministic: false, created: 1_800_000_000 };
    const a = await call(engine(options), ask("Hi", { seed: 7 }));
    const b = await call(engine(options), ask("Hi", { seed: 7 }));
    expect(a.text).toBe(b.text);
  });

  it("decodes greedily at temperature 0 without a seed, with a fresh id", async () => {
    const e = engine({ deterministic: false });
    const a = JSON.parse((await call(e, ask("Hi", { temperature: 0 }))).text) as Chat;
    const b = JSON.parse((await call(e, ask("Hi", { temperature: 0 }))).text) as Chat;
    expect(a.choices[0]?.message.content).toBe(b.choices[0]?.message.content);
    expect(a.id).not.toBe(b.id);
  });

  it("keeps seedless answers identical in deterministic mode, with a fixed created", async () => {
    const a = await call(engine({ deterministic: true }), ask("Hi"));
    expect((await call(engine({ deterministic: true }), ask("Hi"))).text).toBe(a.text);
    expect((JSON.parse(a.text) as Chat).created).toBe(1767225600);
  });
});

describe("simulated engine: log probabilities", () => {
  it("serves chat logprobs with top_logprobs, the sampled token the likeliest", async () => {
    const answer = await json(ask("Hi", { logprobs: true, top_logprobs: 3 }));
    const choice = answer.choices[0];
    const content = choice?.logprobs?.content ?? [];
    expect(content.map((t) => t.token).join("")).toBe(choice?.message.content);
    for (const token of content) {
      expect(token.logprob).toBeLessThanOrEqual(0);
      expect(token.bytes).toEqual([...new TextEncoder().encode(token.token)]);
      expect(token.top_logprobs).toHaveLength(3);
      expect(token.top_logprobs[0]).toEqual({
        token: token.token,
        logprob: token.logprob,
        bytes: token.bytes,
      });
    }
    const again = await json(ask("Hi", { logprobs: true, top_logprobs: 3 }));
    expect(again.choices[0]?.logprobs).toEqual(choice?.logprobs);
  });

  it("leaves logprobs null unless asked, and streams one entry per content chunk", async () => {
    expect((await json(ask("Hi"))).choices[0]?.logprobs).toBeNull();
    const answer = await call(engine(), ask("Hi", { stream: true, logprobs: true }));
    const chunks = events(answer) as {
      choices: { delta: { content?: string }; logprobs: Chat["choices"][0]["logprobs"] }[];
    }[];
    const withText = chunks.filter((c) => (c.choices[0]?.delta.content ?? "") !== "");
    expect(withText.length).toBeGreaterThan(0);
    for (const chunk of withText) {
      expect(chunk.choices[0]?.logprobs?.content.map((t) => t.token)).toEqual([
        chunk.choices[0]?.delta.content,
      ]);
    }
  });

  it("refuses top_logprobs without logprobs and out of range", async () => {
    for (const extra of [{ top_logprobs: 2 }, { logprobs: true, top_logprobs: 21 }]) {
      const answer = await call(engine(), ask("Hi", extra));
      expect(answer.status).toBe(400);
      expect(JSON.parse(answer.text)).toMatchObject({ error: { param: "top_logprobs" } });
    }
  });

  it("serves completions logprobs and echo in OpenAI's legacy shape", async () => {
    const body = {
      model: MODEL,
      prompt: "Once upon a time",
      max_tokens: 8,
      logprobs: 2,
      echo: true,
    };
    const answer = JSON.parse((await call(engine(), body, "/v1/completions")).text) as {
      choices: {
        text: string;
        logprobs: {
          tokens: string[];
          token_logprobs: (number | null)[];
          top_logprobs: (Record<string, number> | null)[];
          text_offset: number[];
        };
      }[];
    };
    const choice = answer.choices[0];
    expect(choice?.text.startsWith("Once upon a time")).toBe(true);
    const lp = choice?.logprobs;
    expect(lp?.tokens.join("")).toBe(choice?.text);
    expect(lp?.token_logprobs[0]).toBeNull();
    expect(lp?.top_logprobs[0]).toBeNull();
    expect(Object.keys(lp?.top_logprobs[1] ?? {})).toHaveLength(2);
    let at = 0;
    lp?.tokens.forEach((token, i) => {
      expect(lp.text_offset[i]).toBe(at);
      at += token.length;
    });
  });

  it("streams the echoed prompt first, then the answer", async () => {
    const body = {
      model: MODEL,
      prompt: "Once upon a time",
      max_tokens: 4,
      echo: true,
      stream: true,
    };
    const chunks = events(await call(engine(), body, "/v1/completions")) as {
      choices: { text: string }[];
    }[];
    expect(chunks[0]?.choices[0]?.text).toBe("Once upon a time");
  });

  it("says it cannot echo token-id prompts", async () => {
    const body = { model: MODEL, prompt: [1, 2, 3], echo: true };
    const answer = await call(engine(), body, "/v1/completions");
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.text)).toMatchObject({
      error: { param: "echo", code: "unsupported_value" },
    });
  });
});

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
};
const search = {
  type: "function",
  function: { name: "searchDocs", parameters: { type: "object" } },
};

describe("simulated engine: tool_choice auto", () => {
  it("calls the tool the last user message mentions, by a word of its name", async () => {
    const answer = await json(ask("What is the weather in Paris?", { tools: [search, weather] }));
    const choice = answer.choices[0];
    expect(choice?.finish_reason).toBe("tool_calls");
    expect(choice?.message.tool_calls?.[0]?.function.name).toBe("get_weather");
    expect(JSON.parse(choice?.message.tool_calls?.[0]?.function.arguments ?? "")).toHaveProperty(
      "city",
    );
    const camel = await json(ask("Please search the manual", { tools: [weather, search] }));
    expect(camel.choices[0]?.message.tool_calls?.[0]?.function.name).toBe("searchDocs");
  });

  it("answers in text when no tool is mentioned or after a tool result", async () => {
    const plain = await json(ask("Tell me a story", { tools: [weather] }));
    expect(plain.choices[0]?.message.content).toEqual(expect.any(String));
    const after = await json({
      model: MODEL,
      tools: [weather],
      messages: [
        { role: "user", content: "What is the weather in Paris?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "c1", type: "function", function: { name: "get_weather", arguments: "{}" } },
          ],
        },
        { role: "tool", tool_call_id: "c1", content: "sunny" },
      ],
    });
    expect(after.choices[0]?.finish_reason).not.toBe("tool_calls");
    const none = await json(ask("weather?", { tools: [weather], tool_choice: "none" }));
    expect(none.choices[0]?.message.tool_calls).toBeUndefined();
  });

  it("honours allowed_tools and refuses custom tools by name", async () => {
    const allowed = await json(
      ask("Tell me a story", {
        tools: [weather, search],
        tool_choice: {
          type: "allowed_tools",
          allowed_tools: {
            mode: "required",
            tools: [{ type: "function", function: { name: "searchDocs" } }],
          },
        },
      }),
    );
    expect(allowed.choices[0]?.message.tool_calls?.[0]?.function.name).toBe("searchDocs");
    const custom = await call(
      engine(),
      ask("Hi", { tools: [weather], tool_choice: { type: "custom", custom: { name: "x" } } }),
    );
    expect(custom.status).toBe(400);
    expect(JSON.parse(custom.text)).toMatchObject({
      error: { param: "tool_choice", code: "unsupported_value" },
    });
    expect(JSON.parse(custom.text).error.message).not.toContain("undefined");
    const customTool = await call(
      engine(),
      ask("Hi", { tools: [{ type: "custom", custom: { name: "x" } }] }),
    );
    expect(JSON.parse(customTool.text)).toMatchObject({ error: { param: "tools[0].type" } });
  });
});
