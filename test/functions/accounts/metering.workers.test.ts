import { exports } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import { formatUsd } from "../../../contracts/pricing.ts";
import { type ErrorBody, usdPicos } from "../../support/edge-requests.ts";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import {
  METER,
  SMALL,
  LARGE,
  pricedConfig,
  send,
  chat,
  get,
  costOf,
  type Usage,
  type RequestRecord,
} from "../../support/metering.workers.ts";

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
