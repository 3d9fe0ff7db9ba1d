import { env, exports } from "cloudflare:workers";
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import app from "../../functions/index.ts";
import { TEST_ADMIN_TOKEN, TEST_API_KEY } from "../support/provided-context.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../support/edge-requests.ts";

async function errorOf(response: Response): Promise<ErrorBody> {
  expect(response.headers.get("content-type")).toMatch(/^application\/json/);
  return response.json<ErrorBody>();
}

/** Runs one request against the edge with a different `WARMGATE_CONFIG`. */
async function fetchWithConfig(config: string, request: Request): Promise<Response> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  await waitOnExecutionContext(ctx);
  return response;
}

describe("routing errors", () => {
  it("answers an unknown path with OpenAI's 404 and a request id", async () => {
    const res = await exports.default.fetch(edgeRequest("/v1/engines/davinci"));
    expect(res.status).toBe(404);
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
    expect(await errorOf(res)).toEqual({
      error: {
        message: "Invalid URL (GET /v1/engines/davinci)",
        type: "invalid_request_error",
        param: null,
        code: null,
      },
    });
  });

  it("answers a wrong method on a known path with 405 and allow", async () => {
    const res = await exports.default.fetch(edgeRequest("/v1/chat/completions"));
    expect(res.status).toBe(405);
    expect(res.headers.get("allow")).toBe("POST");
    expect(res.headers.get("x-request-id")).not.toBeNull();
    expect((await errorOf(res)).error.message).toBe(
      "Invalid method for URL (GET /v1/chat/completions)",
    );

    const models = await exports.default.fetch(edgeRequest("/v1/models", { method: "DELETE" }));
    expect(models.status).toBe(405);
    expect(models.headers.get("allow")).toBe("GET, HEAD");
  });

  it("answers a wrong method with 405 on the admin API and token minting too", async () => {
    const admin = { authorization: `Bearer ${TEST_ADMIN_TOKEN}` };
    for (const [path, method, allow] of [
      ["/admin/keys", "PUT", "GET, HEAD, POST"],
      ["/admin/keys/k_0123456789abcdef", "POST", "GET, HEAD, PATCH, DELETE"],
      ["/admin/keys/k_0123456789abcdef/block", "GET", "POST"],
      ["/admin/keys/k_0123456789abcdef/rotate", "DELETE", "POST"],
      ["/admin/teams", "DELETE", "GET, HEAD, POST"],
      ["/admin/teams/t_0123456789abcdef", "POST", "GET, HEAD, PATCH, DELETE"],
      ["/admin/audit", "POST", "GET, HEAD"],
      ["/admin/usage", "POST", "GET, HEAD"],
      ["/admin/usage/tags", "DELETE", "GET, HEAD"],
      ["/admin/requests", "PUT", "GET, HEAD"],
      ["/admin/breakers", "PUT", "GET, HEAD"],
      ["/admin/canaries", "PUT", "GET, HEAD"],
      ["/admin/stats", "POST", "GET, HEAD"],
      ["/metrics", "POST", "GET, HEAD"],
      ["/v1/tokens", "GET", "POST"],
    ] as const) {
      const res = await exports.default.fetch(edgeRequest(path, { method, headers: admin }));
      const seen = { path, method, status: res.status, allow: res.headers.get("allow") };
      expect(seen).toEqual({ path, method, status: 405, allow });
      expect((await errorOf(res)).error.type).toBe("invalid_request_error");
    }
  });
});

describe("authentication", () => {
  it("refuses a request without a key with 401 invalid_api_key", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody(), anonymous: true }),
    );
    expect(res.status).toBe(401);
    expect((await errorOf(res)).error).toMatchObject({
      type: "invalid_request_error",
      code: "invalid_api_key",
    });
  });

  it("refuses an unknown key without echoing it", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/models", { headers: { authorization: "Bearer sk-not-a-real-key" } }),
    );
    expect(res.status).toBe(401);
    const text = await res.text();
    expect(JSON.parse(text)).toMatchObject({ error: { code: "invalid_api_key" } });
    expect(text).not.toContain("sk-not-a-real-key");
  });
});

describe("request ids", () => {
  it("gives every response its own x-request-id and echoes x-client-request-id", async () => {
    const a = await exports.default.fetch(
      edgeRequest("/v1/models", { headers: { "x-client-request-id": "trace-42" } }),
    );
    const b = await exports.default.fetch(edgeRequest("/v1/models"));
    expect(a.headers.get("x-client-request-id")).toBe("trace-42");
    expect(b.headers.get("x-client-request-id")).toBeNull();
    expect(a.headers.get("x-request-id")).not.toBe(b.headers.get("x-request-id"));
  });

  it("puts the request id on error responses too", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        text: "{",
        headers: { "x-client-request-id": "trace-43" },
      }),
    );
    expect(res.status).toBe(400);
    expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    expect(res.headers.get("x-client-request-id")).toBe("trace-43");
  });
});

describe("body validation", () => {
  it("answers a body that is not JSON with OpenAI's 400", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { text: "{model:" }),
    );
    expect(res.status).toBe(400);
    expect((await errorOf(res)).error).toMatchObject({
      message: expect.stringContaining("We could not parse the JSON body of your request."),
      type: "invalid_request_error",
      param: null,
    });
  });

  it("answers a non-JSON content type with 400", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        text: "model=x",
        headers: { "content-type": "application/x-www-form-urlencoded" },
      }),
    );
    expect(res.status).toBe(400);
    expect((await errorOf(res)).error.code).toBe("unsupported_content_type");
  });

  it("names the bad field in param", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        body: chatBody({
          messages: [
            { role: "user", content: "hi" },
            { role: "robot", content: "x" },
          ],
        }),
      }),
    );
    expect(res.status).toBe(400);
    expect((await errorOf(res)).error).toMatchObject({
      type: "invalid_request_error",
      param: "messages[1].role",
      code: "invalid_value",
    });
  });

  it("validates legacy completions too", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/completions", {
        body: { model: "warmgate-sim-8b", prompt: "x", best_of: 0 },
      }),
    );
    expect(res.status).toBe(400);
    expect((await errorOf(res)).error.param).toBe("best_of");
  });

  it("refuses a body over the limit with 413", async () => {
    const big = JSON.stringify(chatBody({ padding: "x".repeat(8 * 1024 * 1024 + 1) }));
    const res = await exports.default.fetch(edgeRequest("/v1/chat/completions", { text: big }));
    expect(res.status).toBe(413);
    expect((await errorOf(res)).error.code).toBe("request_too_large");
  });

  it("refuses a streamed body that grows past the limit without a content-length", async () => {
    const limit = 1024;
    const config = JSON.parse(env.WARMGATE_CONFIG) as { limits: Record<string, number> };
    config.limits.max_body_bytes = limit;
    const chunk = new TextEncoder().encode(" ".repeat(600));
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(chunk);
        controller.enqueue(chunk);
        controller.close();
      },
    });
    const request = new Request("http://edge.test/v1/chat/completions", {
      method: "POST",
      headers: { authorization: `Bearer ${TEST_API_KEY}`, "content-type": "application/json" },
      body,
    });
    const res = await fetchWithConfig(JSON.stringify(config), request);
    expect(res.status).toBe(413);
  });
});

describe("models", () => {
  it("answers an unknown model with 404 model_not_found", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody({ model: "gpt-9" }) }),
    );
    expect(res.status).toBe(404);
    expect((await errorOf(res)).error).toEqual({
      message: "The model `gpt-9` does not exist or you do not have access to it.",
      type: "invalid_request_error",
      param: "model",
      code: "model_not_found",
    });
  });
});

describe("context length", () => {
  // Its only origin does not exist: an origin call would answer 503, not 400.
  const unreachable = JSON.stringify({
    models: [{ id: "small", max_model_len: 64 }],
    regions: [{ id: "eu", origins: [{ id: "gone", url: "http://127.0.0.1:9" }] }],
    default_region: "eu",
  });

  it("refuses prompt plus max_tokens over the window before calling an origin", async () => {
    const res = await fetchWithConfig(
      unreachable,
      edgeRequest("/v1/chat/completions", {
        body: { model: "small", messages: [{ role: "user", content: "hello" }], max_tokens: 60 },
      }),
    );
    expect(res.status).toBe(400);
    const { error } = await errorOf(res);
    expect(error).toMatchObject({
      type: "invalid_request_error",
      param: "messages",
      code: "context_length_exceeded",
    });
    expect(error.message).toMatch(
      /^This model's maximum context length is 64 tokens\. However, you requested \d+ tokens/,
    );
  });

  it("refuses a prompt that alone fills the window", async () => {
    const res = await fetchWithConfig(
      unreachable,
      edgeRequest("/v1/completions", {
        body: { model: "small", prompt: "word ".repeat(80), max_tokens: 1 },
      }),
    );
    expect(res.status).toBe(400);
    expect((await errorOf(res)).error).toMatchObject({
      param: "prompt",
      code: "context_length_exceeded",
    });
  });

  it("lets a request that fits go on to the origins", async () => {
    const res = await fetchWithConfig(
      unreachable,
      edgeRequest("/v1/chat/completions", {
        body: { model: "small", messages: [{ role: "user", content: "hello" }], max_tokens: 8 },
      }),
    );
    expect(res.status).toBe(503);
    expect((await errorOf(res)).error.code).toBe("no_healthy_origin");
  });
});

describe("configuration errors", () => {
  it("answers every request with a 500 config_error naming the bad field", async () => {
    const bad = JSON.stringify({
      models: [{ id: "m", max_model_len: -1 }],
      regions: [{ id: "eu", origins: [{ id: "o", url: "http://127.0.0.1:1" }] }],
      default_region: "eu",
    });
    for (const path of ["/health", "/v1/models"]) {
      const res = await fetchWithConfig(bad, edgeRequest(path));
      expect(res.status).toBe(500);
      expect(res.headers.get("x-request-id")).toMatch(/^req_/);
      const { error } = await errorOf(res);
      expect(error).toMatchObject({ type: "server_error", code: "config_error" });
      expect(error.message).toContain("models[0].max_model_len");
    }
  });

  it("says when the config is not JSON", async () => {
    const res = await fetchWithConfig("{oops", edgeRequest("/v1/models"));
    expect(res.status).toBe(500);
    expect((await errorOf(res)).error.message).toMatch(/^WARMGATE_CONFIG is not valid JSON/);
  });
});
