import {
  createExecutionContext,
  runInDurableObject,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { afterEach, describe, expect, inject, it } from "vitest";
import type { KeyAccount } from "../../durable-objects/key-account/index.ts";
import { costPicos, formatUsd } from "../../contracts/pricing.ts";
import app from "../../functions/index.ts";
import { ModelPricingSchema } from "../../contracts/config/models.ts";
import { type ErrorBody, chatBody, edgeRequest, usdPicos } from "../support/edge-requests.ts";
import { ADMIN, createKey } from "../support/admin-keys.workers.ts";

function originUrl(id: string): string {
  const origin = inject("testOrigins").find((o) => o.id === id);
  if (origin === undefined) throw new Error(`${id} is not running`);
  return origin.url;
}
const METER = originUrl("meter-1");
const METER_SLOW = originUrl("meter-slow-1");

const SMALL = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };
const LARGE = { input_per_mtok: 0.6, cached_input_per_mtok: 0.15, output_per_mtok: 2.4 };

/** A config over the metering origins with prices and aliases; `batching` as given. */
/** `batching: "always"`: every request goes through the batcher (no idle bypass). */
function pricedConfig(
  options: { batching?: boolean | "always"; deadLarge?: boolean } = {},
): string {
  return JSON.stringify({
    models: [
      { id: "warmgate-sim-8b", max_model_len: 32768, pricing: SMALL },
      { id: "warmgate-sim-70b", max_model_len: 8192, pricing: LARGE },
    ],
    aliases: {
      fast: ["warmgate-sim-8b", "warmgate-sim-70b"],
      best: ["warmgate-sim-70b", "warmgate-sim-8b"],
    },
    regions: [
      {
        id: "metering",
        origins: options.deadLarge
          ? [
              // The large model's only origin is gone; the small one's is fine.
              { id: "meter-gone", url: "http://127.0.0.1:9", models: ["warmgate-sim-70b"] },
              { id: "meter-1", url: METER, models: ["warmgate-sim-8b"] },
            ]
          : [{ id: "meter-1", url: METER }],
      },
      {
        id: "metering-slow",
        origins: [
          {
            id: "meter-slow-1",
            url: METER_SLOW,
            ...(options.deadLarge ? { models: ["warmgate-sim-8b"] } : {}),
          },
        ],
      },
    ],
    default_region: "metering",
    limits: { first_byte_timeout_ms: 3_000, request_timeout_ms: 60_000, retry_budget: 1 },
    batching:
      options.batching === "always" ? { idle_bypass_ms: 0 } : { enabled: options.batching ?? true },
  });
}

/** Runs one request against the edge with `config` and waits for its settlement. */
async function send(
  config: string,
  request: Request,
  read: (response: Response) => Promise<unknown> = (r) => r.arrayBuffer(),
): Promise<{ response: Response; body: unknown }> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  const body = await read(response);
  await waitOnExecutionContext(ctx);
  return { response, body };
}

function chat(key: string, body: Record<string, unknown> = {}, region = "metering"): Request {
  return edgeRequest("/v1/chat/completions", {
    body: chatBody(body),
    headers: { authorization: `Bearer ${key}` },
    region,
  });
}

function get(key: string, path: string): Request {
  return edgeRequest(path, { headers: { authorization: `Bearer ${key}` } });
}

type Usage = {
  prompt_tokens: number;
  completion_tokens: number;
  prompt_tokens_details?: { cached_tokens?: number };
};

function costOf(usage: Usage, pricing: typeof SMALL): bigint {
  return costPicos(
    {
      promptTokens: usage.prompt_tokens,
      cachedTokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
      completionTokens: usage.completion_tokens,
    },
    ModelPricingSchema.parse(pricing),
  );
}

type RequestRecord = {
  id: string;
  model: string;
  status: string;
  outcome: string | null;
  prompt_tokens: number | null;
  cached_tokens: number | null;
  completion_tokens: number | null;
  cost_usd: number;
};

afterEach(async () => {
  await fetch(`${METER}/admin/faults`, { method: "DELETE" }).then((r) => r.arrayBuffer());
});

describe("prices on the request path", () => {
  it("lists each model's prices in USD per 1M tokens", async () => {
    const { key } = await createKey({ name: "models" });
    const { body } = await send(pricedConfig(), get(key, "/v1/models"), (r) => r.json());
    const { data } = body as { data: { id: string; pricing: unknown }[] };
    expect(data.map((m) => [m.id, m.pricing])).toEqual([
      ["warmgate-sim-8b", SMALL],
      ["warmgate-sim-70b", LARGE],
    ]);
  });

  it("sends a JSON answer's exact cost in x-warmgate-cost-usd, as the ledger records it", async () => {
    const { key } = await createKey({ name: "cost-header" });
    const { response, body } = await send(pricedConfig(), chat(key, { max_tokens: 40 }), (r) =>
      r.json(),
    );
    expect(response.status).toBe(200);
    const usage = (body as { usage: Usage }).usage;
    const requestId = response.headers.get("x-request-id") ?? "";
    const { body: found } = await send(
      pricedConfig(),
      get(key, `/v1/usage/requests/${requestId}`),
      (r) => r.json(),
    );
    const record = found as RequestRecord;
    expect(record).toMatchObject({
      id: requestId,
      model: "warmgate-sim-8b",
      status: "settled",
      outcome: "ok",
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
    });
    // The origin's usage counts the prompt tokens its prefix cache served, at their price.
    const expected = costOf(
      { ...usage, prompt_tokens_details: { cached_tokens: record.cached_tokens ?? 0 } },
      SMALL,
    );
    expect(expected).toBeGreaterThan(0n);
    expect(response.headers.get("x-warmgate-cost-usd")).toBe(formatUsd(expected));
    expect(usdPicos(record.cost_usd)).toBe(expected);
  });

  it("bills a stream from the origin's usage, without a cost header", async () => {
    const { key } = await createKey({ name: "stream-cost" });
    const { response, body } = await send(
      pricedConfig(),
      chat(key, { stream: true, stream_options: { include_usage: true }, max_tokens: 12 }),
      (r) => r.text(),
    );
    expect(response.headers.get("x-warmgate-cost-usd")).toBeNull();
    const usage = (body as string)
      .split("\n\n")
      .map((event) => event.replace(/^data: /, ""))
      .filter((data) => data.startsWith("{"))
      .map((data) => JSON.parse(data) as { usage?: Usage | null })
      .find((chunk) => chunk.usage)?.usage;
    expect(usage?.completion_tokens).toBe(12);
    const requestId = response.headers.get("x-request-id") ?? "";
    const { body: record } = await send(
      pricedConfig(),
      get(key, `/v1/usage/requests/${requestId}`),
      (r) => r.json(),
    );
    expect(record).toMatchObject({ status: "settled", outcome: "ok", completion_tokens: 12 });
    expect(usdPicos((record as RequestRecord).cost_usd)).toBe(costOf(usage as Usage, SMALL));
  });

  // Unbatched, the edge relays the stream; batched, the batcher writes it into the response.
  it.each([
    ["unbatched", false],
    ["batched", "always"],
  ] as const)(
    "bills a cancelled %s stream for the tokens generated before the client went away",
    async (_, batching) => {
      const { key } = await createKey({ name: "cancel-cost" });
      const config = pricedConfig({ batching });
      const { response } = await send(
        config,
        chat(key, { stream: true, max_tokens: 2_000 }, "metering-slow"),
        async (r) => {
          const reader = (r.body as ReadableStream<Uint8Array>).getReader();
          for (let i = 0; i < 3; i++) await reader.read();
          await reader.cancel();
        },
      );
      const requestId = response.headers.get("x-request-id") ?? "";
      const { body } = await send(config, get(key, `/v1/usage/requests/${requestId}`), (r) =>
        r.json(),
      );
      const record = body as RequestRecord;
      expect(record).toMatchObject({ status: "settled", outcome: "cancelled" });
      expect(record.completion_tokens).toBeGreaterThan(0);
      expect(record.completion_tokens).toBeLessThan(2_000);
      expect(record.cost_usd).toBeGreaterThan(0);
    },
  );

  it("falls back to the next model of an alias when one has no origin, billing the one that served", async () => {
    const { key } = await createKey({ name: "fallback" });
    const config = pricedConfig({ deadLarge: true, batching: false });
    const { response, body } = await send(config, chat(key, { model: "best" }), (r) => r.json());
    expect(response.status).toBe(200);
    const answer = body as { model: string; usage: Usage };
    expect(answer.model).toBe("warmgate-sim-8b");
    const requestId = response.headers.get("x-request-id") ?? "";
    const { body: found } = await send(config, get(key, `/v1/usage/requests/${requestId}`), (r) =>
      r.json(),
    );
    const record = found as RequestRecord;
    expect(record.model).toBe("warmgate-sim-8b");
    const cached = { prompt_tokens_details: { cached_tokens: record.cached_tokens ?? 0 } };
    expect(response.headers.get("x-warmgate-cost-usd")).toBe(
      formatUsd(costOf({ ...answer.usage, ...cached }, SMALL)),
    );
  });

  it("refuses a request that would overdraw the key's credit with 429 insufficient_quota", async () => {
    // 64 max tokens at $0.40/1M and a short prompt cost under 30 µ$: the first fits, not two.
    const { key } = await createKey({ name: "credit", limits: { credit_usd: 0.00004 } });
    const first = await send(pricedConfig(), chat(key, { max_tokens: 64 }));
    expect(first.response.status).toBe(200);
    const refused = await send(
      pricedConfig(),
      chat(key, { max_tokens: 64, messages: [{ role: "user", content: "more" }] }),
      (r) => r.json(),
    );
    expect(refused.response.status).toBe(429);
    expect(refused.response.headers.get("x-should-retry")).toBe("false");
    expect(refused.response.headers.get("x-ratelimit-limit-requests")).not.toBeNull();
    expect((refused.body as ErrorBody).error).toMatchObject({
      type: "insufficient_quota",
      code: "insufficient_quota",
    });
  });
});

describe("the usage API", () => {
  it("totals a key's requests per day and model, today by default", async () => {
    const { key } = await createKey({ name: "totals" });
    const costs: bigint[] = [];
    for (const model of ["warmgate-sim-8b", "warmgate-sim-70b", "warmgate-sim-8b"]) {
      const { response } = await send(pricedConfig(), chat(key, { model }));
      costs.push(usdPicos(Number(response.headers.get("x-warmgate-cost-usd"))));
    }
    const { body } = await send(pricedConfig(), get(key, "/v1/usage"), (r) => r.json());
    const today = new Date().toISOString().slice(0, 10);
    const report = body as {
      data: { date: string; model: string; requests: number; cost_usd: number }[];
      total: { requests: number; cost_usd: number };
    };
    expect(report.data.map((row) => [row.date, row.model, row.requests])).toEqual([
      [today, "warmgate-sim-70b", 1],
      [today, "warmgate-sim-8b", 2],
    ]);
    expect(report.total.requests).toBe(3);
    expect(usdPicos(report.total.cost_usd)).toBe(costs.reduce((a, b) => a + b, 0n));
  });

  it("refuses a bad range, a browser token, and an unknown request id", async () => {
    const { key } = await createKey({
      name: "usage-errors",
      allowed_origins: ["https://a.example"],
    });
    for (const query of [
      "?from=2026-02-30",
      "?from=2026-05-02&to=2026-05-01",
      "?from=2020-01-01&to=2026-01-01",
    ]) {
      const { response, body } = await send(pricedConfig(), get(key, `/v1/usage${query}`), (r) =>
        r.json(),
      );
      expect(response.status).toBe(400);
      expect((body as ErrorBody).error.code).toBe("invalid_date");
    }
    const minted = await exports.default.fetch("http://edge.test/v1/tokens", {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: "{}",
    });
    const { token } = await minted.json<{ token: string }>();
    const asBrowser = await send(pricedConfig(), get(token, "/v1/usage"));
    expect(asBrowser.response.status).toBe(403);
    const unknown = await send(pricedConfig(), get(key, "/v1/usage/requests/req_nope"), (r) =>
      r.json(),
    );
    expect(unknown.response.status).toBe(404);
    expect((unknown.body as ErrorBody).error.code).toBe("request_not_found");
  });

  it("answers the admin the same across keys", async () => {
    const a = await createKey({ name: "admin-usage-a" });
    const b = await createKey({ name: "admin-usage-b" });
    await send(pricedConfig(), chat(a.key));
    await send(pricedConfig(), chat(b.key));
    await send(pricedConfig(), chat(b.key));
    const res = await exports.default.fetch("http://edge.test/admin/usage", { headers: ADMIN });
    expect(res.status).toBe(200);
    const report = await res.json<{
      total: { requests: number };
      keys: { key_id: string; requests: number }[];
    }>();
    const requestsOf = (id: string) => report.keys.find((k) => k.key_id === id)?.requests;
    expect(requestsOf(a.id)).toBe(1);
    expect(requestsOf(b.id)).toBe(2);
    expect(report.total.requests).toBe(report.keys.reduce((sum, k) => sum + k.requests, 0));
    const one = await exports.default.fetch(`http://edge.test/admin/usage?key_id=${b.id}`, {
      headers: ADMIN,
    });
    expect((await one.json<{ total: { requests: number } }>()).total.requests).toBe(2);
  });
});

describe("conservation", () => {
  it("settles hundreds of mixed requests exactly once, costs summing to the key's totals", async () => {
    const { id, key } = await createKey({ name: "conservation" });
    // Some items fail before their first byte, some streams are cut mid-way.
    await fetch(`${METER}/admin/faults`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        errorRate: 0.15,
        errorStatuses: [500],
        dropAfterTokens: 3,
        dropRate: 0.2,
      }),
    }).then((r) => r.arrayBuffer());
    const ids: string[] = [];
    const kinds = ["json", "stream", "cancel", "json-alias", "stream-usage"] as const;
    for (let round = 0; round < 8; round++) {
      const batch = Array.from({ length: 25 }, async (_, i) => {
        const kind = kinds[(round * 25 + i) % kinds.length] ?? "json";
        const config = pricedConfig({ batching: i % 2 === 0 });
        const body =
          kind === "json-alias"
            ? { model: "fast", max_tokens: 10 + i }
            : kind === "stream-usage"
              ? { stream: true, stream_options: { include_usage: true }, max_tokens: 10 + i }
              : { stream: kind !== "json", max_tokens: kind === "cancel" ? 400 : 10 + i };
        const region = kind === "cancel" ? "metering-slow" : "metering";
        const { response } = await send(config, chat(key, body, region), async (r) => {
          if (kind !== "cancel" || r.body === null) return r.arrayBuffer().catch(() => null);
          const reader = r.body.getReader();
          await reader.read();
          await reader.cancel();
          return null;
        });
        ids.push(response.headers.get("x-request-id") ?? "");
      });
      await Promise.all(batch);
    }
    expect(ids).toHaveLength(200);
    const state = await runInDurableObject(
      env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id)),
      (instance: KeyAccount, s) => {
        instance.flush();
        const sql = s.storage.sql;
        return {
          rows: sql
            // Pico-dollars, as SQLite computes them (exact for these small amounts).
            .exec<{ request_id: string; state: string; cost: number }>(
              "SELECT request_id, state, cost_micros * 1000000 + cost_picos AS cost FROM ledger",
            )
            .toArray(),
          rollup: sql
            .exec<{ requests: number; cost: number }>(
              `SELECT SUM(requests) AS requests, SUM(cost_micros * 1000000 + cost_picos) AS cost
               FROM usage_daily`,
            )
            .one(),
          spend: sql
            .exec<{ settled: number; reserved: number }>(
              `SELECT settled_micros * 1000000 + settled_picos AS settled,
                 reserved_micros * 1000000 + reserved_picos AS reserved
               FROM spend WHERE period = 'all'`,
            )
            .one(),
        };
      },
    );
    // Every admitted request has exactly one ledger row, and every row is closed.
    expect(new Set(ids).size).toBe(200);
    expect(state.rows.map((row) => row.request_id).sort()).toEqual([...ids].sort());
    expect(state.rows.filter((row) => row.state !== "settled")).toEqual([]);
    // Conservation: the rows' costs are the rollups' and the key's spend, nothing reserved.
    const sum = state.rows.reduce((total, row) => total + row.cost, 0);
    expect(sum).toBeGreaterThan(0);
    expect(state.rollup).toEqual({ requests: 200, cost: sum });
    expect(state.spend).toEqual({ settled: sum, reserved: 0 });
    // And the usage API says the same.
    const { body } = await send(pricedConfig(), get(key, "/v1/usage"), (r) => r.json());
    const report = body as { total: { requests: number; cost_usd: number } };
    expect(report.total.requests).toBe(200);
    expect(usdPicos(report.total.cost_usd)).toBe(BigInt(sum));
  });

  it("never lets concurrent requests together overdraw a small budget", async () => {
    const { id, key } = await createKey({
      name: "budget-race",
      limits: { budget_usd_day: 0.0005 },
    });
    const results = await Promise.all(
      Array.from({ length: 60 }, () => send(pricedConfig(), chat(key, { max_tokens: 100 }))),
    );
    const statuses = results.map(({ response }) => response.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(0);
    expect(statuses.filter((s) => s === 429).length).toBeGreaterThan(0);
    expect(statuses.every((s) => s === 200 || s === 429)).toBe(true);
    const spend = await runInDurableObject(
      env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id)),
      (instance: KeyAccount, s) => {
        instance.flush();
        return s.storage.sql
          .exec<{ settled: number; reserved: number }>(
            `SELECT settled_micros * 1000000 + settled_picos AS settled,
               reserved_micros * 1000000 + reserved_picos AS reserved
             FROM spend WHERE period = 'all'`,
          )
          .one();
      },
    );
    expect(spend.reserved).toBe(0);
    expect(spend.settled).toBeGreaterThan(0);
    expect(spend.settled).toBeLessThanOrEqual(500_000_000); // $0.0005 in pico-dollars
  });
});
