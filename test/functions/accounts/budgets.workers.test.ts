import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import app from "../../../functions/index.ts";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { inParallel } from "../../support/in-parallel.ts";

const METER = inject("testOrigins").find((o) => o.id === "meter-1")?.url ?? "";
const PRICING = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };
const CONFIG = JSON.stringify({
  models: [
    { id: "warmgate-sim-8b", max_model_len: 32768, pricing: PRICING },
    { id: "warmgate-sim-70b", max_model_len: 8192, pricing: PRICING },
  ],
  regions: [{ id: "live", origins: [{ id: "meter-1", url: METER }] }],
  default_region: "live",
  limits: { first_byte_timeout_ms: 2_000, request_timeout_ms: 30_000, retry_budget: 0 },
});

async function send(request: Request): Promise<{ status: number; body: unknown }> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: CONFIG }, ctx);
  const text = await response.text();
  await waitOnExecutionContext(ctx);
  return { status: response.status, body: text === "" ? null : JSON.parse(text) };
}

const chat = (key: string, overrides: Record<string, unknown> = {}) =>
  edgeRequest("/v1/chat/completions", {
    body: chatBody({ max_tokens: 50, ...overrides }),
    headers: { authorization: `Bearer ${key}` },
  });

type BudgetStatusJson = {
  period: string;
  spent_usd: number;
  reserved_usd: number;
  max_usd: number;
};

describe("budgets at the edge", () => {
  it("never lets 40 concurrent requests take a 1h budget past its limit, and names it when refusing", async () => {
    const { id, key } = await createKey({
      name: "hourly",
      budgets: [{ period: "1h", max_usd: 0.0001 }],
    });
    const results = await inParallel(40, 40, () => send(chat(key)));
    const statuses = results.map((result) => result.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(0);
    expect(statuses.filter((s) => s === 429).length).toBeGreaterThan(0);
    expect(statuses.every((s) => s === 200 || s === 429)).toBe(true);
    const refused = results.find((result) => result.status === 429)?.body as ErrorBody;
    expect(refused.error).toMatchObject({ type: "insufficient_quota", code: "insufficient_quota" });
    expect(refused.error.message).toMatch(/exceeded the 1h budget \(UTC\) of key/);
    const res = await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      headers: ADMIN,
    });
    const { budget_status } = await res.json<{ budget_status: BudgetStatusJson[] }>();
    const [hour] = budget_status;
    expect(hour?.period).toBe("1h");
    expect((hour?.spent_usd ?? 1) + (hour?.reserved_usd ?? 1)).toBeLessThanOrEqual(0.0001);
  });

  it("admits exactly a model's own rpm of 40 concurrent requests, leases or not", async () => {
    const { key } = await createKey({
      name: "per-model",
      limits: { rpm: 10_000 },
      model_limits: { "warmgate-sim-70b": { rpm: 3 } },
    });
    // Requests for another model first: the isolate holds a lease of the key.
    for (let i = 0; i < 5; i++) expect((await send(chat(key))).status).toBe(200);
    const results = await inParallel(40, 40, () =>
      send(chat(key, { model: "warmgate-sim-70b", max_tokens: 4 })),
    );
    expect(results.filter((result) => result.status === 200)).toHaveLength(3);
    const refused = results.find((result) => result.status === 429)?.body as ErrorBody;
    expect(refused.error).toMatchObject({ code: "rate_limit_exceeded", type: "requests" });
    expect(refused.error.message).toMatch(/model warmgate-sim-70b of key .*Limit 3/);
    expect((await send(chat(key))).status).toBe(200);
  });

  it("holds an end user of browser tokens to the budget the token carries", async () => {
    const { key } = await createKey({ name: "end-user-budget" });
    const mint = await send(
      edgeRequest("/v1/tokens", {
        body: { user: "alice", budgets: [{ period: "1d", max_usd: 0.00003 }] },
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(mint.status).toBe(200);
    const { token, budgets } = mint.body as { token: string; budgets: unknown };
    expect(budgets).toEqual([{ period: "1d", max_usd: 0.00003, soft_usd: null }]);
    const results = await inParallel(10, 10, () => send(chat(token)));
    expect(results.some((result) => result.status === 200)).toBe(true);
    const refused = results.find((result) => result.status === 429)?.body as ErrorBody;
    expect(refused.error.message).toMatch(/1d budget \(UTC\) of this end user of key/);
    // The key itself still has room.
    expect((await send(chat(key))).status).toBe(200);
  });
});
