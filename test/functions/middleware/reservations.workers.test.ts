import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import app from "../../../functions/index.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";

const METER = inject("testOrigins").find((o) => o.id === "meter-1")?.url ?? "";
const PRICING = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };

const configWith = (origin: { id: string; url: string }) =>
  JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768, pricing: PRICING }],
    regions: [{ id: "live", origins: [origin] }],
    default_region: "live",
    limits: { first_byte_timeout_ms: 2_000, request_timeout_ms: 30_000, retry_budget: 0 },
  });
const LIVE = configWith({ id: "meter-1", url: METER });
// Nothing listens on the discard port: every attempt fails before any byte.
const DEAD = configWith({ id: "gone-1", url: "http://127.0.0.1:9" });

async function send(request: Request, config = LIVE): Promise<{ status: number; body: unknown }> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  const text = await response.text();
  await waitOnExecutionContext(ctx);
  return { status: response.status, body: text === "" ? null : JSON.parse(text) };
}

function post(key: string, path: string, body: Record<string, unknown>) {
  return edgeRequest(path, { body, headers: { authorization: `Bearer ${key}` } });
}

describe("reservations cover every sequence", () => {
  it("refuses n sequences whose worst case alone exceeds the per-minute token limit", async () => {
    const { key } = await createKey({ name: "tpm-n", limits: { tpm: 1_000 } });
    const { status, body } = await send(
      post(key, "/v1/chat/completions", chatBody({ n: 50, max_tokens: 100 })),
    );
    expect(status).toBe(429);
    const { error } = body as ErrorBody;
    expect(error.code).toBe("rate_limit_exceeded");
    expect(error.message).toMatch(/Limit 1000, Requested 5\d{3}/);
    // One sequence of the same size fits.
    const one = await send(post(key, "/v1/chat/completions", chatBody({ max_tokens: 100 })));
    expect(one.status).toBe(200);
  });

  it("refuses n sequences whose worst case exceeds the remaining budget", async () => {
    const { key } = await createKey({
      name: "budget-n",
      budgets: [{ period: "1d", max_usd: 0.0004 }],
    });
    const { status, body } = await send(
      post(key, "/v1/chat/completions", chatBody({ n: 64, max_tokens: 800 })),
    );
    expect(status).toBe(429);
    expect((body as ErrorBody).error.code).toBe("insufficient_quota");
  });

  it("reserves every prompt of a prompt list and best_of sequences of each", async () => {
    const { key } = await createKey({ name: "tpm-list", limits: { tpm: 2_000 } });
    const prompts = Array.from({ length: 32 }, (_, i) => `Prompt number ${i} about the sea.`);
    const list = await send(
      post(key, "/v1/completions", { model: "warmgate-sim-8b", prompt: prompts, max_tokens: 60 }),
    );
    expect(list.status).toBe(429);
    expect((list.body as ErrorBody).error.message).toMatch(/Limit 2000, Requested \d{4}/);
    const bestOf = await send(
      post(key, "/v1/completions", {
        model: "warmgate-sim-8b",
        prompt: "One prompt.",
        max_tokens: 200,
        best_of: 12,
      }),
    );
    expect(bestOf.status).toBe(429);
    const fits = await send(
      post(key, "/v1/completions", {
        model: "warmgate-sim-8b",
        prompt: prompts.slice(0, 4),
        max_tokens: 60,
      }),
    );
    expect(fits.status).toBe(200);
  });

  it("bills no more than it reserved: what n sequences deliver is within the reservation", async () => {
    const { key } = await createKey({
      name: "budget-fit",
      budgets: [{ period: "1d", max_usd: 1 }],
    });
    const res = await send(post(key, "/v1/chat/completions", chatBody({ n: 8, max_tokens: 40 })));
    expect(res.status).toBe(200);
    const { usage, choices } = res.body as {
      usage: { completion_tokens: number };
      choices: unknown[];
    };
    expect(choices).toHaveLength(8);
    expect(usage.completion_tokens).toBeLessThanOrEqual(8 * 40);
  });
});

describe("a request no origin began gives its tokens back", () => {
  it("leaves the per-minute token limit as it was after an outage", async () => {
    const { key } = await createKey({ name: "outage", limits: { tpm: 1_000 } });
    for (let i = 0; i < 3; i++) {
      const failed = await send(
        post(key, "/v1/chat/completions", chatBody({ max_tokens: 700 })),
        DEAD,
      );
      expect(failed.status).toBeGreaterThanOrEqual(500);
    }
    const served = await send(post(key, "/v1/chat/completions", chatBody({ max_tokens: 700 })));
    expect(served.status).toBe(200);
  });
});
