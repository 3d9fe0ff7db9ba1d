import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { costPicos, formatUsd, picosToUsd } from "../../../contracts/pricing.ts";
import app from "../../../functions/index.ts";
import { ModelPricingSchema } from "../../../contracts/config/models.ts";
import { type ErrorBody, edgeRequest } from "../../support/edge-requests.ts";
import { createKey } from "../../support/admin-keys.workers.ts";

const METER = inject("testOrigins").find((o) => o.id === "meter-1")?.url ?? "";
const CHAT = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };
const EMBED = { input_per_mtok: 20, cached_input_per_mtok: 20, output_per_mtok: 0 };

function config(batching: "always" | "off"): string {
  return JSON.stringify({
    models: [
      { id: "warmgate-sim-8b", max_model_len: 32768, pricing: CHAT },
      { id: "warmgate-sim-embed", max_model_len: 8192, pricing: EMBED },
    ],
    regions: [{ id: "metering", origins: [{ id: "meter-1", url: METER }] }],
    default_region: "metering",
    batching: batching === "always" ? { idle_bypass_ms: 0 } : { enabled: false },
  });
}

async function send(
  key: string,
  path: string,
  body?: unknown,
  batching: "always" | "off" = "always",
) {
  const ctx = createExecutionContext();
  const request = edgeRequest(path, {
    ...(body === undefined ? {} : { body }),
    headers: { authorization: `Bearer ${key}` },
  });
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config(batching) }, ctx);
  const text = await response.text();
  await waitOnExecutionContext(ctx);
  return { response, text };
}

interface Recorded {
  model: string;
  outcome: string;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  cost_usd: number;
}

async function recorded(key: string, response: Response): Promise<Recorded> {
  const id = response.headers.get("x-request-id") ?? "";
  return JSON.parse((await send(key, `/v1/usage/requests/${id}`)).text) as Recorded;
}

const ASK = {
  model: "warmgate-sim-8b",
  input: "Say something short about the sea.",
  max_output_tokens: 12,
};

describe("POST /v1/responses", () => {
  for (const batching of ["always", "off"] as const) {
    it(`answers a response and bills its usage exactly (batching ${batching})`, async () => {
      const { key } = await createKey({ name: `responses-${batching}` });
      const { response, text } = await send(key, "/v1/responses", ASK, batching);
      expect(response.status).toBe(200);
      const body = JSON.parse(text) as {
        object: string;
        output: { type: string; content: { type: string; text: string }[] }[];
        usage: {
          input_tokens: number;
          output_tokens: number;
          input_tokens_details: { cached_tokens: number };
        };
      };
      expect(body.object).toBe("response");
      expect(body.output[0]?.content[0]?.type).toBe("output_text");
      const record = await recorded(key, response);
      expect(record).toMatchObject({
        model: "warmgate-sim-8b",
        outcome: "ok",
        prompt_tokens: body.usage.input_tokens,
        cached_tokens: body.usage.input_tokens_details.cached_tokens,
        completion_tokens: body.usage.output_tokens,
      });
      const cost = costPicos(
        {
          promptTokens: record.prompt_tokens,
          cachedTokens: record.cached_tokens,
          completionTokens: record.completion_tokens,
        },
        ModelPricingSchema.parse(CHAT),
      );
      expect(record.cost_usd).toBe(picosToUsd(cost));
      expect(response.headers.get("x-warmgate-cost-usd")).toBe(formatUsd(cost));
    });
  }

  it("streams typed events ending in the response with its usage, and bills it", async () => {
    const { key } = await createKey({ name: "responses-stream" });
    const { response, text } = await send(key, "/v1/responses", { ...ASK, stream: true });
    expect(response.headers.get("content-type")).toContain("text/event-stream");
    const events = text
      .split("\n\n")
      .filter((e) => e !== "")
      .map((e) => /^event: (\S+)/.exec(e)?.[1]);
    expect(events[0]).toBe("response.created");
    expect(events).toContain("response.output_text.delta");
    expect(events.at(-1)).toMatch(/^response\.(completed|incomplete)$/);
    const last = JSON.parse(text.trim().split("\n").at(-1)?.slice("data: ".length) ?? "{}") as {
      response: { usage: { input_tokens: number; output_tokens: number } };
    };
    const record = await recorded(key, response);
    expect(record.completion_tokens).toBe(last.response.usage.output_tokens);
    expect(record.prompt_tokens).toBe(last.response.usage.input_tokens);
  });

  it("refuses the fields that need a stored response, naming each", async () => {
    const { key } = await createKey({ name: "responses-stored" });
    const cases: [Record<string, unknown>, string][] = [
      [{ previous_response_id: "resp_1" }, "previous_response_id"],
      [{ store: true }, "store"],
      [{ background: true }, "background"],
      [{ conversation: "conv_1" }, "conversation"],
    ];
    for (const [extra, param] of cases) {
      const { response, text } = await send(key, "/v1/responses", { ...ASK, ...extra });
      expect(response.status).toBe(400);
      expect((JSON.parse(text) as ErrorBody).error).toMatchObject({
        type: "invalid_request_error",
        param,
        code: "unsupported_parameter",
      });
    }
    const kept = await send(key, "/v1/responses", { ...ASK, store: false });
    expect(kept.response.status).toBe(200);
  });

  it("answers retrieving a response with a 404 that says none are kept", async () => {
    const { key } = await createKey({ name: "responses-get" });
    for (const [method, path] of [
      ["GET", "/v1/responses/resp_1"],
      ["DELETE", "/v1/responses/resp_1"],
      ["POST", "/v1/responses/resp_1/cancel"],
    ] as const) {
      const ctx = createExecutionContext();
      const response = await app.fetch(
        edgeRequest(path, { method, headers: { authorization: `Bearer ${key}` } }),
        { ...env, WARMGATE_CONFIG: config("always") },
        ctx,
      );
      expect(response.status).toBe(404);
      const body: ErrorBody = await response.json();
      expect(body.error.code).toBe("response_not_found");
      await waitOnExecutionContext(ctx);
    }
    const anonymous = await app.fetch(
      edgeRequest("/v1/responses/resp_1", { anonymous: true }),
      { ...env, WARMGATE_CONFIG: config("always") },
      createExecutionContext(),
    );
    expect(anonymous.status).toBe(401);
  });

  it("says counting input tokens is not offered, not that a response is missing", async () => {
    const { key } = await createKey({ name: "responses-input-tokens" });
    const { response, text } = await send(key, "/v1/responses/input_tokens", ASK);
    expect(response.status).toBe(404);
    const body = JSON.parse(text) as ErrorBody;
    expect(body.error).toMatchObject({
      type: "invalid_request_error",
      code: "endpoint_not_offered",
    });
    expect(body.error.message).toContain("usage.input_tokens");
    expect(body.error.message).not.toContain("No response");
  });

  it("validates the body as OpenAI does", async () => {
    const { key } = await createKey({ name: "responses-invalid" });
    const missing = await send(key, "/v1/responses", { model: "warmgate-sim-8b" });
    expect(JSON.parse(missing.text)).toMatchObject({
      error: { param: "input", code: "missing_required_parameter" },
    });
    const unknown = await send(key, "/v1/responses", { ...ASK, model: "nope" });
    expect(unknown.response.status).toBe(404);
    const nameless = await send(key, "/v1/responses", { ...ASK, tools: [{ type: "function" }] });
    expect(nameless.response.status).toBe(400);
    expect((JSON.parse(nameless.text) as ErrorBody).error.param).toMatch(/^tools\[0\]/);
    // A tool type the engine may know (web search, MCP, …) reaches it; the simulated one refuses it.
    const other = await send(key, "/v1/responses", { ...ASK, tools: [{ type: "web_search" }] });
    expect(JSON.parse(other.text)).toMatchObject({ error: { param: "tools[0].type" } });
    const called = await send(key, "/v1/responses", {
      ...ASK,
      input: "What is the weather?",
      tools: [{ type: "function", name: "get_weather", parameters: { type: "object" } }],
    });
    expect(called.response.status).toBe(200);
  });
});

describe("POST /v1/embeddings", () => {
  it("answers vectors and bills the input tokens only", async () => {
    const { key } = await createKey({ name: "embeddings" });
    const input = ["the sea is calm", "the sea is rough tonight"];
    const { response, text } = await send(key, "/v1/embeddings", {
      model: "warmgate-sim-embed",
      input,
      dimensions: 16,
    });
    expect(response.status).toBe(200);
    const body = JSON.parse(text) as {
      data: { index: number; embedding: number[] }[];
      usage: { prompt_tokens: number };
    };
    expect(body.data.map((d) => [d.index, d.embedding.length])).toEqual([
      [0, 16],
      [1, 16],
    ]);
    const record = await recorded(key, response);
    expect(record).toMatchObject({
      model: "warmgate-sim-embed",
      prompt_tokens: body.usage.prompt_tokens,
      completion_tokens: 0,
    });
    const cost = costPicos(
      {
        promptTokens: record.prompt_tokens,
        cachedTokens: record.cached_tokens,
        completionTokens: 0,
      },
      ModelPricingSchema.parse(EMBED),
    );
    expect(cost).toBeGreaterThan(0n);
    expect(record.cost_usd).toBe(picosToUsd(cost));
  });

  it("refuses bad input with OpenAI's errors, and a chat model with the engine's", async () => {
    const { key } = await createKey({ name: "embeddings-invalid" });
    const empty = await send(key, "/v1/embeddings", { model: "warmgate-sim-embed", input: [] });
    expect(empty.response.status).toBe(400);
    expect((JSON.parse(empty.text) as ErrorBody).error.param).toBe("input");
    const format = await send(key, "/v1/embeddings", {
      model: "warmgate-sim-embed",
      input: "x",
      encoding_format: "int8",
    });
    expect((JSON.parse(format.text) as ErrorBody).error.param).toBe("encoding_format");
    const chatModel = await send(key, "/v1/embeddings", { model: "warmgate-sim-8b", input: "x" });
    expect(chatModel.response.status).toBe(400);
    expect((JSON.parse(chatModel.text) as ErrorBody).error.code).toBe("model_not_supported");
  });
});
