import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import app from "../../../functions/index.ts";
import { edgeRequest } from "../../support/edge-requests.ts";
import { createKey } from "../../support/admin-keys.workers.ts";

const METER = inject("testOrigins").find((o) => o.id === "meter-1")?.url ?? "";
// text-embedding-3-small's price: a short input costs a small fraction of a micro-dollar.
const EMBED = { input_per_mtok: 0.02, cached_input_per_mtok: 0.02, output_per_mtok: 0 };
const CONFIG = JSON.stringify({
  models: [{ id: "warmgate-sim-embed", max_model_len: 8192, pricing: EMBED }],
  regions: [{ id: "metering", origins: [{ id: "meter-1", url: METER }] }],
  default_region: "metering",
  batching: { enabled: false },
});

async function send(key: string, path: string, body?: unknown) {
  const ctx = createExecutionContext();
  const request = edgeRequest(path, {
    ...(body === undefined ? {} : { body }),
    headers: { authorization: `Bearer ${key}` },
  });
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: CONFIG }, ctx);
  const text = await response.text();
  await waitOnExecutionContext(ctx);
  return { response, json: JSON.parse(text) as unknown };
}

// The exact cost of `tokens` at $0.02 per million, as the nearest double to its decimal.
function usdOf(tokens: number): number {
  return Number(`${tokens * 2}e-8`);
}

describe("costs below a micro-dollar", () => {
  it("bills 100 embeddings requests at $0.02 per million tokens exactly, each and in total", async () => {
    const { key } = await createKey({ name: "sub-micro", limits: { rpm: 1_000 } });
    const sent: { id: string; tokens: number }[] = [];
    for (let i = 0; i < 100; i++) {
      const { response, json } = await send(key, "/v1/embeddings", {
        model: "warmgate-sim-embed",
        input: "the sea is calm",
      });
      expect(response.status).toBe(200);
      const used = (json as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
      sent.push({ id: response.headers.get("x-request-id") ?? "", tokens: used });
      expect(Number(response.headers.get("x-warmgate-cost-usd"))).toBe(usdOf(used));
    }
    const [first] = sent;
    const { json: record } = await send(key, `/v1/usage/requests/${first?.id}`);
    expect(record).toMatchObject({ status: "settled", cost_usd: usdOf(first?.tokens ?? 0) });
    const tokens = sent.reduce((total, request) => total + request.tokens, 0);
    expect(usdOf(tokens)).toBeGreaterThan(0);
    const { json: report } = await send(key, "/v1/usage");
    expect(report).toMatchObject({
      data: [{ model: "warmgate-sim-embed", requests: 100, cost_usd: usdOf(tokens) }],
      total: { requests: 100, prompt_tokens: tokens, cost_usd: usdOf(tokens) },
    });
  });
});
