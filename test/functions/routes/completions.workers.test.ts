import { env, exports } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { bytesOf, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { sendWith } from "../../support/test-origins.workers.ts";

const origins = inject("testOrigins");
const us1 = origins.find((origin) => origin.id === "us-1");
if (us1 === undefined) throw new Error("us-1 is not running");

/** The same request straight to an origin's own OpenAI route. */
function direct(path: string, body: unknown): Promise<Response> {
  return fetch(`${us1?.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

function viaEdge(path: string, body: unknown): Promise<Response> {
  return exports.default.fetch(edgeRequest(path, { body, region: "us" }));
}

describe("byte identity", () => {
  it("returns exactly the origin's bytes for a non-streaming chat completion", async () => {
    const body = chatBody({ messages: [{ role: "user", content: "Byte identity, plain JSON." }] });
    // Warm the prefix cache first: `cached_tokens` depends on it.
    await bytesOf(await direct("/v1/chat/completions", body));
    const edge = await viaEdge("/v1/chat/completions", body);
    const origin = await direct("/v1/chat/completions", body);
    expect(edge.status).toBe(200);
    expect(edge.headers.get("x-warmgate-origin")).toBe("us-1");
    expect(await bytesOf(edge)).toEqual(await bytesOf(origin));
  });

  it("returns exactly the origin's bytes for a streamed chat completion", async () => {
    const body = chatBody({
      messages: [{ role: "user", content: "Byte identity, streamed." }],
      stream: true,
      stream_options: { include_usage: true },
    });
    await bytesOf(await direct("/v1/chat/completions", body));
    const edge = await viaEdge("/v1/chat/completions", body);
    const origin = await direct("/v1/chat/completions", body);
    expect(edge.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const edgeBytes = await bytesOf(edge);
    expect(edgeBytes).toEqual(await bytesOf(origin));
    expect(new TextDecoder().decode(edgeBytes)).toMatch(/data: \[DONE\]\n\n$/);
  });

  it("returns exactly the origin's bytes for legacy completions, streamed and not", async () => {
    for (const stream of [false, true]) {
      const body = {
        model: "warmgate-sim-8b",
        prompt: "Once upon a time",
        max_tokens: 12,
        seed: 4,
        stream,
      };
      await bytesOf(await direct("/v1/completions", body));
      const edge = await viaEdge("/v1/completions", body);
      const origin = await direct("/v1/completions", body);
      expect(await bytesOf(edge)).toEqual(await bytesOf(origin));
    }
  });

  it("passes fields it does not know to the origin and keeps OpenAI's usage rules", async () => {
    const body = chatBody({ top_k: 5, repetition_penalty: 1.1, stream: true });
    const res = await viaEdge("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    const text = await res.text();
    // The client did not ask for usage, so no usage chunk reaches it.
    expect(text).not.toContain('"usage":{');
    expect(text).toMatch(/data: \[DONE\]\n\n$/);
  });
});

describe("models and aliases", () => {
  it("lists the configured models with max_model_len in OpenAI's list shape", async () => {
    const res = await exports.default.fetch(edgeRequest("/v1/models"));
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({
      object: "list",
      data: [
        expect.objectContaining({
          id: "warmgate-sim-8b",
          object: "model",
          owned_by: "warmgate",
          max_model_len: 32768,
        }),
        expect.objectContaining({ id: "warmgate-sim-70b", object: "model", max_model_len: 8192 }),
      ],
    });
  });

  it("retrieves one model by id or alias, and 404s an unknown one", async () => {
    const one = await exports.default.fetch(edgeRequest("/v1/models/warmgate-sim-70b"));
    expect(await one.json()).toMatchObject({ id: "warmgate-sim-70b", max_model_len: 8192 });
    const alias = await exports.default.fetch(edgeRequest("/v1/models/fast"));
    expect(await alias.json()).toMatchObject({ id: "warmgate-sim-8b" });
    const missing = await exports.default.fetch(edgeRequest("/v1/models/nope"));
    expect(missing.status).toBe(404);
    expect(await missing.json()).toMatchObject({ error: { code: "model_not_found" } });
  });

  it("sends an aliased request to the origin under the model's id", async () => {
    const res = await viaEdge("/v1/chat/completions", chatBody({ model: "fast" }));
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ object: "chat.completion", model: "warmgate-sim-8b" });
  });
});

describe("region choice", () => {
  it("serves from the region the override header names", async () => {
    for (const region of ["eu", "us"]) {
      const res = await exports.default.fetch(
        edgeRequest("/v1/chat/completions", { body: chatBody(), region }),
      );
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-region")).toBe(region);
      await res.arrayBuffer();
    }
  });

  it("refuses an override naming no region", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody(), region: "mars" }),
    );
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({
      error: { code: "invalid_region", param: "x-warmgate-region" },
    });
  });

  it("picks the caller's nearest region from request.cf", async () => {
    const cases = [
      { cf: { continent: "NA", country: "US", colo: "ORD" }, region: "us" },
      { cf: { continent: "AS", country: "SG", colo: "SIN" }, region: "us" },
      { cf: { continent: "NA", country: "GB", colo: "ORD" }, region: "eu" },
      { cf: { continent: "EU", country: "DE", colo: "FRA" }, region: "eu" },
    ];
    for (const { cf, region } of cases) {
      const request = new Request(edgeRequest("/v1/chat/completions", { body: chatBody() }), {
        cf: cf as unknown as IncomingRequestCfProperties,
      });
      const res = await exports.default.fetch(request);
      expect(res.headers.get("x-warmgate-region")).toBe(region);
      await res.arrayBuffer();
    }
  });

  it("spreads requests over a region's origins in turn where routing is off", async () => {
    // With routing on, a prompt goes where its prefix is warm (delivery/routing.workers.test.ts).
    const config = JSON.stringify({
      ...(JSON.parse(env.WARMGATE_CONFIG) as Record<string, unknown>),
      routing: { enabled: false },
    });
    const served = new Set<string | null>();
    for (let i = 0; i < 4; i++) {
      const res = await sendWith(
        config,
        edgeRequest("/v1/chat/completions", { body: chatBody(), region: "eu" }),
      );
      served.add(res.headers.get("x-warmgate-origin"));
    }
    expect(served).toEqual(new Set(["eu-1", "eu-2"]));
  });
});
