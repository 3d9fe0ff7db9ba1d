import { env, exports } from "cloudflare:workers";
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { afterEach, describe, expect, inject, it } from "vitest";
import app from "../../../functions/index.ts";
import { createOpenAI } from "@ai-sdk/openai";
import { streamText } from "ai";
import OpenAI, { APIError } from "openai";
import { type ErrorBody, chatBody, edgeRequest, metricValue } from "../../support/edge-requests.ts";
import { TEST_API_KEY } from "../../support/provided-context.ts";

// Only this file injects faults, and only into the `faulty` region's origins.
const origins = inject("testOrigins");
function originUrl(id: string): string {
  const origin = origins.find((o) => o.id === id);
  if (origin === undefined) throw new Error(`${id} is not running`);
  return origin.url;
}
const FAULTY = ["faulty-1", "faulty-2"];

async function setFaults(id: string, faults: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${originUrl(id)}/admin/faults`, {
    method: "PUT",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(faults),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

async function faultCount(id: string, kind: string): Promise<number> {
  const text = await (await fetch(`${originUrl(id)}/metrics`)).text();
  return metricValue(text, "warmgate_origin_fault_injections_total", `kind="${kind}"`);
}

/**
 * A config whose regions hold exactly the given origins, in order. `faulty-1@x` is faulty-1
 * under another id, so the edge has no memory of its earlier failures.
 */
function configOf(regions: string[][], limits: Record<string, number> = {}): string {
  return JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
    regions: regions.map((ids, i) => ({
      id: `r${i}`,
      origins: ids.map((id) => ({
        id,
        url: id === "dead" ? "http://127.0.0.1:9" : originUrl(id.split("@")[0] ?? id),
      })),
    })),
    default_region: "r0",
    limits: { first_byte_timeout_ms: 3_000, ...limits },
  });
}

async function fetchWithConfig(config: string, request: Request): Promise<Response> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  // Read the body before waiting: settlement runs when the stream ends.
  const body = await response.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return new Response(body, response);
}

const chat = (overrides: Record<string, unknown> = {}) =>
  edgeRequest("/v1/chat/completions", { body: chatBody(overrides) });

afterEach(async () => {
  await Promise.all(
    FAULTY.map((id) =>
      fetch(`${originUrl(id)}/admin/faults`, { method: "DELETE" }).then((r) => r.arrayBuffer()),
    ),
  );
});

describe("failover before the first byte", () => {
  it("leaves an origin that answered 429 alone until its retry-after, without counting it sick", async () => {
    await setFaults("faulty-1", { errorRate: 1, errorStatuses: [429] });
    const before = await faultCount("faulty-1", "error");
    const config = configOf([["faulty-1@busy"], ["faulty-2@busy"]]);
    const first = await fetchWithConfig(config, chat());
    expect(first.status).toBe(200);
    expect(first.headers.get("x-warmgate-attempts")).toBe("2");
    // Within the origin's retry-after (1 s): the overloaded origin is tried only last.
    const second = await fetchWithConfig(config, chat());
    expect(second.headers.get("x-warmgate-origin")).toBe("faulty-2@busy");
    expect(second.headers.get("x-warmgate-attempts")).toBe("1");
    expect((await faultCount("faulty-1", "error")) - before).toBe(1);
  });

  it("says the origins tried are busy, with their retry-after, when the last one answered 503", async () => {
    await setFaults("faulty-1", { errorRate: 1, errorStatuses: [503] });
    await setFaults("faulty-2", { errorRate: 1, errorStatuses: [503] });
    const res = await fetchWithConfig(
      configOf([["faulty-1@all-busy", "faulty-2@all-busy"]]),
      chat(),
    );
    expect(res.status).toBe(503);
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      type: "server_error",
      code: "no_healthy_origin",
      message: expect.stringMatching(/busy.*try again in \d+s/),
    });
  });

  it("moves to another origin of the region when one answers 500", async () => {
    await setFaults("faulty-1", { errorRate: 1, errorStatuses: [500] });
    const before = await faultCount("faulty-1", "error");
    // Fresh names (no quarantine left from the tests before), straight to origins, whose
    // turns rotate: within two requests one goes to faulty-1 first.
    const config = JSON.stringify({
      ...JSON.parse(configOf([["faulty-1@m500", "faulty-2@m500"]])),
      batching: { enabled: false },
    });
    for (let i = 0; i < 4; i++) {
      const res = await fetchWithConfig(config, chat());
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("faulty-2@m500");
    }
    // faulty-1 really was tried and failed.
    expect(await faultCount("faulty-1", "error")).toBeGreaterThan(before);
  });

  it("moves to the next region when every origin of the nearest fails", async () => {
    await setFaults("faulty-1", { errorRate: 1, errorStatuses: [503] });
    await setFaults("faulty-2", { errorRate: 1, errorStatuses: [429] });
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody(), region: "faulty" }),
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("x-warmgate-region")).toBe("eu");
    await res.arrayBuffer();
  });

  it("steps over an origin it cannot connect to", async () => {
    const res = await fetchWithConfig(configOf([["dead"], ["faulty-2"]]), chat());
    expect(res.status).toBe(200);
    expect(res.headers.get("x-warmgate-origin")).toBe("faulty-2");
  });

  it("quarantines an origin sent to straight for its region and model's origin_quarantine_ms", async () => {
    // Straight to origins; only the override quarantines, and no breaker or retry budget
    // steps in: an origin tried first again shows a second attempt.
    const config = JSON.stringify({
      models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
      regions: [
        {
          id: "q",
          origins: [
            { id: "dead@quarantine", url: "http://127.0.0.1:9" },
            { id: "faulty-2@quarantine", url: originUrl("faulty-2") },
          ],
        },
      ],
      default_region: "q",
      limits: { first_byte_timeout_ms: 3_000, retry_floor: 1_000 },
      breakers: { enabled: false },
      batching: {
        enabled: false,
        origin_quarantine_ms: 0,
        overrides: [{ region: "q", model: "warmgate-sim-8b", origin_quarantine_ms: 600_000 }],
      },
    });
    const attempts: (string | null)[] = [];
    for (let i = 0; i < 6; i++) {
      const res = await fetchWithConfig(config, chat());
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("faulty-2@quarantine");
      attempts.push(res.headers.get("x-warmgate-attempts"));
    }
    // Requests take turns at the origins: without the quarantine the dead one would be
    // tried first by every other request; with it, once.
    expect(attempts.filter((n) => n !== "1").length).toBeLessThanOrEqual(1);
  });

  it("stops after the retry budget", async () => {
    await setFaults("faulty-1", { errorRate: 1, errorStatuses: [500] });
    const none = await fetchWithConfig(
      configOf([["faulty-1@budget-0"], ["faulty-2"]], { retry_budget: 0 }),
      chat(),
    );
    expect(none.status).toBe(502);
    const one = await fetchWithConfig(
      configOf([["faulty-1@budget-1"], ["faulty-2"]], { retry_budget: 1 }),
      chat(),
    );
    expect(one.status).toBe(200);
    expect(one.headers.get("x-warmgate-origin")).toBe("faulty-2");
  });
});

describe("when no origin can answer", () => {
  it("answers 502 origin_error when every origin fails", async () => {
    for (const id of FAULTY) await setFaults(id, { errorRate: 1, errorStatuses: [500] });
    const res = await fetchWithConfig(configOf([FAULTY]), chat());
    expect(res.status).toBe(502);
    const body = JSON.parse(await res.text()) as ErrorBody;
    expect(body.error).toMatchObject({ type: "server_error", code: "origin_error" });
    expect(body.error.message).not.toMatch(/at |Error:/);
  });

  it("answers 503 no_healthy_origin when no origin can be reached", async () => {
    const res = await fetchWithConfig(configOf([["dead"]]), chat());
    expect(res.status).toBe(503);
    expect(JSON.parse(await res.text())).toMatchObject({ error: { code: "no_healthy_origin" } });
  });

  it("answers 504 origin_timeout when origins do not answer in time", async () => {
    for (const id of FAULTY) await setFaults(id, { hangRate: 1 });
    const res = await fetchWithConfig(
      configOf([FAULTY], { first_byte_timeout_ms: 200 }),
      chat({ stream: true }),
    );
    expect(res.status).toBe(504);
    expect(JSON.parse(await res.text())).toMatchObject({ error: { code: "origin_timeout" } });
  });

  it("passes the origin's own 429 through when it is the last resort", async () => {
    await setFaults("faulty-1", { errorRate: 1, errorStatuses: [429] });
    const res = await fetchWithConfig(configOf([["faulty-1"]]), chat());
    expect(res.status).toBe(429);
    expect(JSON.parse(await res.text())).toMatchObject({ error: { type: "rate_limit_error" } });
  });
});

describe("failure after the first byte", () => {
  it("ends the stream with an OpenAI error event and no [DONE]", async () => {
    for (const id of FAULTY) await setFaults(id, { dropAfterTokens: 3, dropRate: 1 });
    // Under ids of its own: tests before left these origins busy in this isolate.
    const res = await fetchWithConfig(
      configOf([["faulty-1@cut", "faulty-2@cut"]]),
      chat({ stream: true, max_tokens: 50 }),
    );
    expect(res.status).toBe(200);
    const text = await res.text();
    const events = text.split("\n\n").filter((e) => e !== "");
    const last = events.at(-1) ?? "";
    expect(events.length).toBeGreaterThan(1);
    expect(events[0]).toMatch(/^data: \{"id":"chatcmpl-/);
    expect(JSON.parse(last.replace(/^data: /, ""))).toEqual({
      error: {
        message: "The origin server failed to process the request.",
        type: "server_error",
        param: null,
        code: "origin_error",
      },
    });
    expect(text).not.toContain("[DONE]");
  });

  it("tries a JSON completion its origin cut again elsewhere: nothing had reached the client", async () => {
    await setFaults("faulty-1", { dropAfterTokens: 3, dropRate: 1 });
    const before = await faultCount("faulty-1", "drop");
    // Fresh names: no quarantine left from the tests before; the cutting origin in the
    // first region, so that the first request goes there whatever the Batcher's turn.
    const config = configOf([["faulty-1@cut"], ["faulty-2@cut"]]);
    for (let i = 0; i < 4; i++) {
      const res = await fetchWithConfig(config, chat({ max_tokens: 20 }));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("faulty-2@cut");
      const body = await res.json<{ usage: { completion_tokens: number } }>();
      expect(body.usage.completion_tokens).toBe(20);
    }
    expect(await faultCount("faulty-1", "drop")).toBeGreaterThan(before);
  });

  it("answers a JSON completion the origin cut with an OpenAI error, never a partial 200", async () => {
    for (const id of FAULTY) await setFaults(id, { dropAfterTokens: 3, dropRate: 1 });
    // Every origin it may go to cuts it.
    const config = configOf([FAULTY]);
    const res = await fetchWithConfig(config, chat({ max_tokens: 50 }));
    expect(res.status).toBe(502);
    expect(JSON.parse(await res.text())).toEqual({
      error: {
        message: "The origin server failed to process the request.",
        type: "server_error",
        param: null,
        code: "origin_error",
      },
    });
    // Its usage record lists both attempts as failed: no answer was served.
    const id = res.headers.get("x-request-id");
    let record: { status?: string; attempts?: { result: string }[] } = {};
    for (let i = 0; i < 100 && record.status !== "settled"; i++) {
      const usage = await fetchWithConfig(config, edgeRequest(`/v1/usage/requests/${id}`));
      record = await usage.json();
      if (record.status !== "settled") await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(record.attempts?.map((attempt) => attempt.result)).toEqual(["failed", "failed"]);
  });
});

describe("a Responses stream cut after its first byte", () => {
  const ways = [
    ["straight from its origin", { enabled: false }],
    ["through a Batcher", {}],
  ] as const;
  for (const [way, batching] of ways) {
    it(`ends with the typed error event and response.failed, ${way}`, async () => {
      for (const id of FAULTY) await setFaults(id, { dropAfterTokens: 5, dropRate: 1 });
      const config = JSON.stringify({ ...JSON.parse(configOf([FAULTY])), batching });
      const body = { model: "warmgate-sim-8b", input: "Tell me a story.", max_output_tokens: 50 };
      const res = await fetchWithConfig(
        config,
        edgeRequest("/v1/responses", { body: { ...body, stream: true } }),
      );
      expect(res.status).toBe(200);
      const text = await res.text();
      const events = text
        .split("\n\n")
        .filter((e) => e !== "")
        .map((e) => {
          const [name = "", data = ""] = e.split("\n");
          return {
            name: name.replace(/^event: /, ""),
            data: JSON.parse(data.replace(/^data: /, "")),
          };
        });
      const [failed, error] = [events.at(-1), events.at(-2)];
      expect(error?.name).toBe("error");
      expect(error?.data).toEqual({
        type: "error",
        code: "origin_error",
        message: "The origin server failed to process the request.",
        param: null,
        sequence_number: events.length - 2,
      });
      expect(failed?.name).toBe("response.failed");
      expect(failed?.data).toMatchObject({
        type: "response.failed",
        sequence_number: events.length - 1,
        response: {
          id: events[0]?.data.response.id,
          status: "failed",
          error: {
            code: "origin_error",
            message: "The origin server failed to process the request.",
          },
        },
      });
      expect(text).not.toContain('data: {"error"');

      // The official SDK raises the typed error event as an APIError with its code.
      const client = new OpenAI({
        apiKey: TEST_API_KEY,
        baseURL: "http://edge.test/v1",
        maxRetries: 0,
        fetch: (input, init) => fetchWithConfig(config, new Request(input, init)),
      });
      const stream = await client.responses.create({ ...body, stream: true });
      const seen: string[] = [];
      const thrown = await (async () => {
        try {
          for await (const event of stream) seen.push(event.type);
        } catch (caught) {
          return caught;
        }
        return null;
      })();
      expect(seen[0]).toBe("response.created");
      expect(thrown).toBeInstanceOf(APIError);
      expect((thrown as APIError).code).toBe("origin_error");
    });
  }

  it("is an error the Vercel AI SDK reads as the origin's failure, not a validation failure", async () => {
    for (const id of FAULTY) await setFaults(id, { dropAfterTokens: 5, dropRate: 1 });
    const config = configOf([FAULTY]);
    const provider = createOpenAI({
      baseURL: "http://edge.test/v1",
      apiKey: TEST_API_KEY,
      fetch: (input, init) => fetchWithConfig(config, new Request(input, init)),
    });
    const streamed = streamText({
      model: provider.responses("warmgate-sim-8b"),
      prompt: "Tell me a story.",
      maxOutputTokens: 50,
      maxRetries: 0,
      // Read from the stream below, not logged.
      onError: () => {},
    });
    const errors: unknown[] = [];
    let text = "";
    for await (const part of streamed.fullStream) {
      if (part.type === "error") errors.push(part.error);
      if (part.type === "text-delta") text += part.text;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(errors).toHaveLength(1);
    expect((errors[0] as Error).message).toContain("The origin server failed");
  });
});
