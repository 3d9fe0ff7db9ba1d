import { afterEach, describe, expect, it } from "vitest";
import { createOriginApp } from "../../../origin/server.ts";
import { MAX_BODY_DEPTH, tooDeepAt } from "../../../origin/sim/request-limits.ts";
import { call, closeEngines, engine } from "./sim-call.ts";

afterEach(closeEngines);

const MODEL = "warmgate-sim-8b";
const EMBED = "warmgate-sim-embed";
const DEEP = 100_000;
const hello = [{ role: "user", content: "Hello" }];

/** A JSON schema (as text: too deep for JSON.stringify) whose properties nest `depth` times. */
function deepSchema(depth: number): string {
  const open = '{"type":"object","properties":{"a":';
  return `${open.repeat(depth)}{"type":"string"}${"}}".repeat(depth)}`;
}

/** `[[[…]]]`, `depth` arrays deep, as text. */
function deepArrays(depth: number): string {
  return `${"[".repeat(depth)}${"]".repeat(depth)}`;
}

/** A request body with `fields` spliced in as raw JSON text. */
function body(fields: Record<string, unknown>, raw: Record<string, string>): string {
  const parts = Object.entries(raw).map(([key, text]) => `${JSON.stringify(key)}:${text}`);
  return `{${[JSON.stringify(fields).slice(1, -1), ...parts].join(",")}}`;
}

const deepFormat = body(
  { model: MODEL, messages: hello, max_tokens: 4 },
  {
    response_format: `{"type":"json_schema","json_schema":{"name":"x","schema":${deepSchema(DEEP)}}}`,
  },
);
const deepTool = body(
  { model: MODEL, messages: hello, max_tokens: 4 },
  { tools: `[{"type":"function","function":{"name":"f","parameters":${deepSchema(DEEP)}}}]` },
);
const manyPrompts = JSON.stringify({
  model: MODEL,
  prompt: Array.from({ length: DEEP }, () => "Hi"),
  max_tokens: 1,
});
const manyTools = JSON.stringify({
  model: MODEL,
  messages: hello,
  max_tokens: 1,
  tools: Array.from({ length: 129 }, (_, i) => ({ type: "function", function: { name: `f${i}` } })),
});

describe("the simulated engine's request limits", () => {
  it("answers a response_format schema nested 100,000 levels with a 400 naming the limit", async () => {
    const answer = await call(engine(), deepFormat);
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.text)).toEqual({
      error: {
        message: `Invalid 'response_format.json_schema.schema': nested too deeply. Expected at most ${MAX_BODY_DEPTH} levels of objects and arrays in the request body.`,
        type: "invalid_request_error",
        param: "response_format.json_schema.schema",
        code: "nesting_above_max_depth",
      },
    });
  });

  it("answers tool parameters nested 100,000 levels with a 400 naming the tool", async () => {
    const answer = await call(engine(), deepTool);
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.text)).toMatchObject({
      error: { param: "tools[0].function.parameters", code: "nesting_above_max_depth" },
    });
  });

  it("refuses a Responses request with deep metadata, and goes on serving", async () => {
    // Echoed into the response object, this once threw out of the engine's step loop.
    const e = engine();
    const deep = body(
      { model: MODEL, input: "Hi", max_output_tokens: 4 },
      { metadata: deepArrays(DEEP) },
    );
    const refused = await call(e, deep, "/v1/responses");
    expect(refused.status).toBe(400);
    expect(JSON.parse(refused.text)).toMatchObject({ error: { param: "metadata[0]" } });
    const next = await call(
      e,
      { model: MODEL, input: "Hi", max_output_tokens: 4 },
      "/v1/responses",
    );
    expect(next.status).toBe(200);
    expect(next.outcome.outcome).toBe("ok");
  });

  it("answers a list of 100,000 prompts with a 400 naming the limit", async () => {
    const answer = await call(engine(), manyPrompts, "/v1/completions");
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.text)).toEqual({
      error: {
        message:
          "Invalid 'prompt': array too long. Expected an array with maximum length 2048, but got an array with length 100000 instead.",
        type: "invalid_request_error",
        param: "prompt",
        code: "array_above_max_length",
      },
    });
  });

  it("refuses more sequences than it starts for one request: prompts times n", async () => {
    const prompt = Array.from({ length: 17 }, () => "Hi");
    const e = engine();
    const refused = await call(
      e,
      { model: MODEL, prompt, n: 128, max_tokens: 1 },
      "/v1/completions",
    );
    expect(refused.status).toBe(400);
    expect(JSON.parse(refused.text)).toMatchObject({
      error: { param: "n", code: "invalid_value" },
    });
    const served = await call(
      e,
      { model: MODEL, prompt: prompt.slice(1), n: 128, max_tokens: 1 },
      "/v1/completions",
    );
    expect(served.status).toBe(200);
  });

  it("takes 128 tools and refuses the 129th", async () => {
    const e = engine();
    const refused = await call(e, manyTools);
    expect(refused.status).toBe(400);
    expect(JSON.parse(refused.text)).toMatchObject({
      error: { param: "tools", code: "array_above_max_length" },
    });
    const tools = (JSON.parse(manyTools) as { tools: unknown[] }).tools.slice(1);
    const served = await call(e, { model: MODEL, messages: hello, max_tokens: 1, tools });
    expect(served.status).toBe(200);
  });
});

describe("an origin on the simulated engine, given poison input", () => {
  const poison: [string, string, string][] = [
    ["a deep response_format schema", "/v1/chat/completions", deepFormat],
    ["deep tool parameters", "/v1/chat/completions", deepTool],
    ["100,000 prompts", "/v1/completions", manyPrompts],
    ["129 tools", "/v1/chat/completions", manyTools],
    [
      "a deep Responses tool",
      "/v1/responses",
      body(
        { model: MODEL, input: "Hi" },
        { tools: `[{"type":"function","name":"f","parameters":${deepSchema(DEEP)}}]` },
      ),
    ],
    [
      "a deep message",
      "/v1/chat/completions",
      body(
        { model: MODEL, max_tokens: 4 },
        { messages: `[{"role":"user","content":"Hi","x":${deepArrays(DEEP)}}]` },
      ),
    ],
    [
      "a deep embeddings user",
      "/v1/embeddings",
      body({ model: EMBED, input: "Hi" }, { user: deepArrays(DEEP) }),
    ],
  ];

  it.each(poison)("answers %s with an OpenAI-shaped 400, never a 500", async (_, path, text) => {
    const app = createOriginApp({
      engine: engine(),
      originId: "o",
      gpu: { snapshot: () => Promise.resolve({ available: false, reason: "none" }) },
    });
    const response = await app.request(path, { method: "POST", body: text });
    expect(response.status).toBe(400);
    const { error } = (await response.json()) as { error: Record<string, unknown> };
    expect(error["type"]).toBe("invalid_request_error");
    expect(typeof error["message"]).toBe("string");
    expect(typeof error["param"]).toBe("string");
  });
});

/** A chat-shaped body `depth` levels deep, its deepest part under `messages[0].content[0].x`. */
function nest(depth: number): unknown {
  return JSON.parse(`{"messages":[{"content":[{"x":${deepArrays(depth - 5)}}]}]}`);
}

describe("tooDeepAt", () => {
  it("takes the deepest body allowed and names where a deeper one goes too deep", () => {
    expect(tooDeepAt(nest(MAX_BODY_DEPTH))).toBeNull();
    expect(tooDeepAt(nest(MAX_BODY_DEPTH + 1))).toBe("messages[0].content[0].x");
  });

  it("names at most three keys, with one index after each", () => {
    const value = JSON.parse(`{"a":{"b":[[{"c":{"d":${deepArrays(10)}}}]]}}`) as unknown;
    expect(tooDeepAt(value, 4)).toBe("a.b[0]");
    expect(tooDeepAt({ a: { b: { c: { d: { e: [1] } } } } }, 4)).toBe("a.b.c");
  });
});
