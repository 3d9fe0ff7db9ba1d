import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import {
  MAX_BODY_DEPTH,
  MAX_LOGIT_BIAS,
  MAX_PROMPTS,
  MAX_SCHEMA_DEPTH,
  MAX_SEQUENCES,
  MAX_TOOLS,
} from "../../../functions/request/bounds.ts";

describe("error messages quote little of the input", () => {
  it("answers a 2 MB role with a short message naming the field", async () => {
    const role = "x".repeat(2_000_000);
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        body: chatBody({ messages: [{ role, content: "hi" }] }),
      }),
    );
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text.length).toBeLessThan(1_000);
    const { error } = JSON.parse(text) as ErrorBody;
    expect(error.param).toBe("messages[0].role");
    expect(error.message).toContain("(2000000 characters)");
  });

  it("clips a huge unknown model name", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody({ model: "m".repeat(100_000) }) }),
    );
    expect(res.status).toBe(404);
    expect((await res.text()).length).toBeLessThan(1_000);
  });
});

const chatIn = (key: string, region: string) =>
  exports.default.fetch(
    edgeRequest("/v1/chat/completions", {
      body: chatBody({ max_tokens: 2 }),
      headers: { authorization: `Bearer ${key}` },
      region,
    }),
  );

describe("x-warmgate-region", () => {
  it("is refused for a key created without allow_region_override", async () => {
    const { key } = await createKey({ name: "no-override", allow_region_override: false });
    const res = await chatIn(key, "eu");
    expect(res.status).toBe(403);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      type: "permission_error",
      code: "region_override_not_allowed",
      param: "x-warmgate-region",
    });
  });

  it("is off by default and shown on the key", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: ADMIN,
      body: JSON.stringify({ name: "default-override" }),
    });
    const created = await res.json<{ key: string; allow_region_override: boolean }>();
    expect(created.allow_region_override).toBe(false);
    expect((await chatIn(created.key, "eu")).status).toBe(403);
  });

  it("is honoured for a key that allows it, and an unknown region is refused briefly", async () => {
    const { key } = await createKey({ name: "override", allow_region_override: true });
    const served = await chatIn(key, "eu");
    expect(served.status).toBe(200);
    expect(served.headers.get("x-warmgate-region")).toBe("eu");
    await served.arrayBuffer();
    const unknown = await chatIn(key, "r".repeat(5_000));
    expect(unknown.status).toBe(400);
    const text = await unknown.text();
    expect(text.length).toBeLessThan(1_000);
    expect((JSON.parse(text) as ErrorBody).error.code).toBe("invalid_region");
  });
});

describe("JSON content type on the admin and token routes", () => {
  it("refuses an admin body that is not declared JSON", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: { authorization: ADMIN.authorization, "content-type": "text/plain" },
      body: JSON.stringify({ name: "plain" }),
    });
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error.code).toBe("unsupported_content_type");
  });

  it("refuses a token request that is not declared JSON", async () => {
    const { key } = await createKey({
      name: "tokens-type",
      allowed_origins: ["https://app.example"],
    });
    const res = await exports.default.fetch("http://edge.test/v1/tokens", {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/x-www-form-urlencoded",
      },
      body: "user=alice",
    });
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error.code).toBe("unsupported_content_type");
  });

  it("refuses an admin body over the size limit with 413", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: ADMIN,
      body: JSON.stringify({ name: "n".repeat(200_000) }),
    });
    expect(res.status).toBe(413);
    expect((await res.json<ErrorBody>()).error.type).toBe("invalid_request_error");
  });
});

const MODEL = "warmgate-sim-8b";

/** A JSON schema nested `depth` levels deep: arrays of arrays of … strings. */
function nestedSchema(depth: number): Record<string, unknown> {
  let schema: Record<string, unknown> = { type: "string" };
  for (let level = 1; level < depth; level++) schema = { type: "array", items: schema };
  return schema;
}

const schemaFormat = (depth: number) => ({
  type: "json_schema",
  json_schema: { name: "answer", schema: nestedSchema(depth) },
});

const tools = (count: number, parameters?: Record<string, unknown>) =>
  Array.from({ length: count }, (_, i) => ({
    type: "function",
    function: { name: `tool_${i}`, parameters },
  }));

/** Posts `body` to `path`; the status and, for an error, its OpenAI error object. */
async function post(path: string, body: unknown) {
  const res = await exports.default.fetch(edgeRequest(path, { body }));
  const text = await res.text();
  const error = res.status === 200 ? undefined : (JSON.parse(text) as ErrorBody).error;
  return { status: res.status, error };
}

describe("JSON nesting", () => {
  it("refuses a 100,000-level response_format schema, naming it", async () => {
    const { status, error } = await post(
      "/v1/chat/completions",
      chatBody({ response_format: schemaFormat(100_000) }),
    );
    expect(status).toBe(400);
    expect(error).toEqual({
      message: `'response_format.json_schema.schema' is nested 100000 levels deep; at most ${MAX_SCHEMA_DEPTH} are allowed.`,
      type: "invalid_request_error",
      param: "response_format.json_schema.schema",
      code: "json_above_max_depth",
    });
  });

  it("names the tool whose parameters nest too deep, on chat and the Responses API", async () => {
    const chat = await post(
      "/v1/chat/completions",
      chatBody({ tools: [...tools(2), ...tools(1, nestedSchema(100_000))] }),
    );
    expect(chat).toMatchObject({ status: 400, error: { param: "tools[2].function.parameters" } });
    const responses = await post("/v1/responses", {
      model: MODEL,
      input: "hi",
      tools: [{ type: "function", name: "deep", parameters: nestedSchema(100_000) }],
    });
    expect(responses).toMatchObject({ status: 400, error: { param: "tools[0].parameters" } });
    const format = await post("/v1/responses", {
      model: MODEL,
      input: "hi",
      text: { format: { type: "json_schema", name: "answer", schema: nestedSchema(100_000) } },
    });
    expect(format).toMatchObject({ status: 400, error: { param: "text.format.schema" } });
  });

  it("answers an 8 MB body of nested arrays with a 400 naming its depth", async () => {
    const depth = 4_000_000;
    const res = await exports.default.fetch(
      edgeRequest("/v1/completions", { text: "[".repeat(depth) + "]".repeat(depth) }),
    );
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      message: `The request body is nested ${depth} levels deep; at most ${MAX_BODY_DEPTH} are allowed.`,
      param: null,
      code: "json_above_max_depth",
    });
  });

  it("accepts a schema at the depth limit and refuses one level more", async () => {
    const at = await post(
      "/v1/chat/completions",
      chatBody({ response_format: schemaFormat(MAX_SCHEMA_DEPTH) }),
    );
    expect(at.status).toBe(200);
    const past = await post(
      "/v1/chat/completions",
      chatBody({ response_format: schemaFormat(MAX_SCHEMA_DEPTH + 1) }),
    );
    expect(past.error?.message).toBe(
      `'response_format.json_schema.schema' is nested ${MAX_SCHEMA_DEPTH + 1} levels deep; at most ${MAX_SCHEMA_DEPTH} are allowed.`,
    );
  });

  it("accepts an engine extension as deep as the body allows and refuses one level more", async () => {
    const fieldLimit = MAX_BODY_DEPTH - 1;
    const at = await post(
      "/v1/chat/completions",
      chatBody({ guided_json: nestedSchema(fieldLimit) }),
    );
    expect(at.status).toBe(200);
    const past = await post(
      "/v1/chat/completions",
      chatBody({ guided_json: nestedSchema(fieldLimit + 1) }),
    );
    expect(past).toMatchObject({
      status: 400,
      error: { param: "guided_json", code: "json_above_max_depth" },
    });
  });
});

const prompts = (count: number) => Array.from({ length: count }, (_, i) => `prompt ${i}`);

/** A `logit_bias` of `count` entries. */
const bias = (count: number) =>
  Object.fromEntries(Array.from({ length: count }, (_, i) => [String(1000 + i), -1]));

describe("list sizes", () => {
  it("refuses 100,000 prompts, as texts or token-id lists, before any origin", async () => {
    for (const prompt of [prompts(100_000), Array.from({ length: 100_000 }, () => [1, 2])]) {
      const { status, error } = await post("/v1/completions", { model: MODEL, prompt });
      expect(status).toBe(400);
      expect(error).toMatchObject({
        message: `Invalid 'prompt': array too long. Expected an array with maximum length ${MAX_PROMPTS}, but got an array with length 100000 instead.`,
        param: "prompt",
        code: "array_above_max_length",
      });
    }
    const embeddings = await post("/v1/embeddings", {
      model: "warmgate-sim-embed",
      input: Array.from({ length: 100_000 }, () => [1]),
    });
    expect(embeddings).toMatchObject({ status: 400, error: { param: "input" } });
  });

  it("accepts as many prompts as the limit and refuses one more", async () => {
    const at = await post("/v1/completions", {
      model: MODEL,
      prompt: prompts(MAX_PROMPTS),
      max_tokens: 1,
    });
    expect(at.status).toBe(200);
    const past = await post("/v1/completions", {
      model: MODEL,
      prompt: prompts(MAX_PROMPTS + 1),
      max_tokens: 1,
    });
    expect(past).toMatchObject({ status: 400, error: { code: "array_above_max_length" } });
  });

  it("bounds the prompts times n", async () => {
    const half = prompts(MAX_SEQUENCES / 2);
    const at = await post("/v1/completions", { model: MODEL, prompt: half, n: 2, max_tokens: 1 });
    expect(at.status).toBe(200);
    const past = await post("/v1/completions", { model: MODEL, prompt: half, n: 3, max_tokens: 1 });
    expect(past).toMatchObject({
      status: 400,
      error: {
        message: `Invalid 'n': integer above maximum value. Expected a value <= 2 for ${MAX_SEQUENCES / 2} prompts (at most ${MAX_SEQUENCES} sequences per request), but got 3 instead.`,
        param: "n",
        code: "integer_above_max_value",
      },
    });
  });

  it("refuses best_of below n, as vLLM does (the best n of best_of are returned)", async () => {
    const fewer = await post("/v1/completions", { model: MODEL, prompt: "x", n: 3, best_of: 2 });
    expect(fewer).toMatchObject({
      status: 400,
      error: {
        message: "Invalid 'best_of': must be greater than or equal to n, got n=3 and best_of=2.",
        param: "best_of",
        code: "invalid_value",
      },
    });
    const same = await post("/v1/completions", {
      model: MODEL,
      prompt: "x",
      n: 2,
      best_of: 2,
      max_tokens: 1,
    });
    expect(same.status).toBe(200);
  });

  it("refuses 10,000 tools, functions or Responses API tools", async () => {
    const functions = Array.from({ length: 10_000 }, (_, i) => ({ name: `fn_${i}` }));
    for (const [path, body, param] of [
      ["/v1/chat/completions", chatBody({ tools: tools(10_000) }), "tools"],
      ["/v1/chat/completions", chatBody({ functions }), "functions"],
      [
        "/v1/responses",
        { model: MODEL, input: "hi", tools: functions.map((f) => ({ type: "function", ...f })) },
        "tools",
      ],
    ] as const) {
      const { status, error } = await post(path, body);
      expect(status).toBe(400);
      expect(error).toMatchObject({ param, code: "array_above_max_length" });
      expect(error?.message).toContain(`maximum length ${MAX_TOOLS}`);
    }
  });

  it("accepts as many tools as the limit and refuses one more", async () => {
    expect((await post("/v1/chat/completions", chatBody({ tools: tools(MAX_TOOLS) }))).status).toBe(
      200,
    );
    const past = await post("/v1/chat/completions", chatBody({ tools: tools(MAX_TOOLS + 1) }));
    expect(past).toMatchObject({ status: 400, error: { param: "tools" } });
  });

  it("accepts as many logit_bias entries as the limit and refuses one more", async () => {
    const at = await post("/v1/chat/completions", chatBody({ logit_bias: bias(MAX_LOGIT_BIAS) }));
    expect(at.status).toBe(200);
    const past = await post(
      "/v1/chat/completions",
      chatBody({ logit_bias: bias(MAX_LOGIT_BIAS + 1) }),
    );
    expect(past).toMatchObject({
      status: 400,
      error: {
        message: `Invalid 'logit_bias': too many properties. Expected an object with at most ${MAX_LOGIT_BIAS} properties, but got an object with ${MAX_LOGIT_BIAS + 1} properties instead.`,
        param: "logit_bias",
        code: "object_above_max_size",
      },
    });
  });
});
