import OpenAI, { APIError, BadRequestError, NotFoundError } from "openai";
import { describe, expect, it } from "vitest";
import { twoRegionStack } from "../support/two-regions.ts";
import { metricValue } from "../support/edge-requests.ts";

// One origin per region, so `x-warmgate-region` pins the origin that serves a request.
let client: OpenAI;
const suite = twoRegionStack({ seed: 11, deterministic: true }, ({ stack }) => {
  client = new OpenAI({
    baseURL: `${stack.edgeUrl}/v1`,
    apiKey: stack.apiKey,
    maxRetries: 0,
    defaultHeaders: { "x-warmgate-region": "eu" },
  });
});

const MODEL = "warmgate-sim-8b";
const user = (content: string) => [{ role: "user" as const, content }];

async function rawBytes(url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return new Uint8Array(await res.arrayBuffer());
}

async function originMetrics() {
  const text = await (
    await fetch(`${suite.euOrigin}/metrics`, { headers: suite.originAdmin() })
  ).text();
  return {
    inFlight: metricValue(text, "warmgate_origin_items_in_flight"),
    // Through the cancel endpoint (so END still reports the usage), or by a dropped call.
    cancelled:
      metricValue(text, "warmgate_origin_cancellations_total", 'reason="cancel"') +
      metricValue(text, "warmgate_origin_cancellations_total", 'reason="client"'),
  };
}

describe("the official openai SDK against the edge", () => {
  it("gets a non-streaming chat completion with usage", async () => {
    const completion = await client.chat.completions.create({
      model: MODEL,
      messages: user("Hello there."),
      max_tokens: 12,
    });
    expect(completion.object).toBe("chat.completion");
    expect(completion.model).toBe(MODEL);
    expect(completion.choices[0]?.message.content).toEqual(expect.any(String));
    expect(completion.usage?.completion_tokens).toBe(12);
  });

  it("streams a chat completion chunk by chunk, with usage when asked", async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: user("Stream to me."),
      max_tokens: 10,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage: OpenAI.CompletionUsage | null | undefined;
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      text += chunk.choices[0]?.delta.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    expect(chunks).toBeGreaterThan(2);
    expect(text.length).toBeGreaterThan(0);
    expect(usage?.completion_tokens).toBe(10);
  });

  it("raises BadRequestError with the param for an invalid field", async () => {
    const bad = [{ role: "robot", content: "x" }] as unknown as OpenAI.ChatCompletionMessageParam[];
    const error = await client.chat.completions
      .create({ model: MODEL, messages: bad })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BadRequestError);
    expect(error).toMatchObject({ status: 400, param: "messages[0].role", code: "invalid_value" });
  });

  it("raises NotFoundError for an unknown model", async () => {
    const error = await client.chat.completions
      .create({ model: "no-such-model", messages: user("hi") })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(NotFoundError);
    expect(error).toMatchObject({ status: 404, code: "model_not_found" });
  });

  it("raises BadRequestError context_length_exceeded for a request over the window", async () => {
    const error = await client.chat.completions
      .create({ model: "warmgate-sim-70b", messages: user("hi"), max_tokens: 9000 })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BadRequestError);
    expect(error).toMatchObject({
      status: 400,
      code: "context_length_exceeded",
      param: "messages",
    });
  });

  it("lists models with their context windows", async () => {
    const models = await client.models.list();
    const ids = models.data.map((m) => [
      m.id,
      (m as unknown as { max_model_len: number }).max_model_len,
    ]);
    expect(ids).toEqual([
      ["warmgate-sim-8b", 32768],
      ["warmgate-sim-70b", 8192],
      ["warmgate-sim-embed", 8192],
    ]);
  });
});

describe("bytes through the edge", () => {
  for (const stream of [false, true]) {
    it(`are identical to the origin's for the same request (${stream ? "streaming" : "JSON"})`, async () => {
      const body = {
        model: MODEL,
        messages: user(`Identity check, stream=${stream}.`),
        max_tokens: 20,
        seed: 5,
        stream,
      };
      const originAccess = { authorization: `Bearer ${suite.stack.originAccessToken}` };
      await rawBytes(`${suite.euOrigin}/v1/chat/completions`, body, originAccess);
      const viaEdge = await rawBytes(`${suite.stack.edgeUrl}/v1/chat/completions`, body, {
        authorization: `Bearer ${suite.stack.apiKey}`,
        "x-warmgate-region": "eu",
      });
      const direct = await rawBytes(`${suite.euOrigin}/v1/chat/completions`, body, originAccess);
      expect(viaEdge.byteLength).toBeGreaterThan(0);
      expect(Buffer.from(viaEdge).equals(Buffer.from(direct))).toBe(true);
    });
  }
});

describe("cancellation and failure", () => {
  it("cancels the origin's item when the client aborts mid-stream", async () => {
    const before = await originMetrics();
    const abort = new AbortController();
    const stream = await client.chat.completions.create(
      {
        model: MODEL,
        messages: user("A very long story, please."),
        max_tokens: 4000,
        stream: true,
      },
      { signal: abort.signal },
    );
    let chunks = 0;
    // The SDK ends iteration (or throws an abort error) once the signal fires.
    await (async () => {
      for await (const chunk of stream) {
        if (chunk.choices[0]?.finish_reason) break;
        if (++chunks === 2) abort.abort();
      }
    })().catch(() => {});
    expect(chunks).toBe(2);
    let after = await originMetrics();
    for (let i = 0; i < 200 && (after.inFlight > 0 || after.cancelled === before.cancelled); i++) {
      await new Promise((resolve) => setTimeout(resolve, 25));
      after = await originMetrics();
    }
    expect(after.inFlight).toBe(0);
    expect(after.cancelled).toBe(before.cancelled + 1);
  });

  it("ends a stream whose origin fails mid-way with an error event, never [DONE]", async () => {
    await fetch(`${suite.euOrigin}/admin/faults`, {
      method: "PUT",
      headers: { "content-type": "application/json", ...suite.originAdmin() },
      body: JSON.stringify({ dropAfterTokens: 4, dropRate: 1 }),
    }).then((r) => r.arrayBuffer());
    const body = { model: MODEL, messages: user("This will break."), max_tokens: 30, stream: true };
    const raw = new TextDecoder().decode(
      await rawBytes(`${suite.stack.edgeUrl}/v1/chat/completions`, body, {
        authorization: `Bearer ${suite.stack.apiKey}`,
        "x-warmgate-region": "eu",
      }),
    );
    expect(raw).not.toContain("[DONE]");
    expect(raw.trimEnd().split("\n\n").at(-1)).toMatch(
      /^data: \{"error":\{.*"code":"origin_error"/,
    );

    const stream = await client.chat.completions.create({ ...body, stream: true });
    const error = await (async () => {
      for await (const _ of stream) {
        // Drain until the error event.
      }
    })().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).message).toContain(
      "The origin server failed to process the request.",
    );
  });
});
