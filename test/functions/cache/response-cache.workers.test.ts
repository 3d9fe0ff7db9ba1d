import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import app from "../../../functions/index.ts";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { type ErrorBody, metricValue, usdPicos } from "../../support/edge-requests.ts";
import {
  type RequestRecord,
  SMALL,
  chat,
  costOf,
  get,
  pricedConfig,
  send,
} from "../../support/metering.workers.ts";
import { edgeRequest } from "../../support/edge-requests.ts";

/** The metering config with a `cache` section. */
function cached(cache: Record<string, unknown> = {}): string {
  return JSON.stringify({ ...JSON.parse(pricedConfig()), cache });
}

/** The same, with every origin gone: only the cache can answer. */
function originsGone(cache: Record<string, unknown> = {}): string {
  const config = JSON.parse(cached(cache)) as { regions: { origins: { url: string }[] }[] };
  for (const region of config.regions) {
    for (const origin of region.origins) origin.url = "http://127.0.0.1:9";
  }
  return JSON.stringify(config);
}

// A body that samples (no seed, no `temperature: 0`).
const SAMPLED = { seed: undefined, temperature: 0.9, max_tokens: 24 };

async function ask(
  config: string,
  key: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): Promise<{ response: Response; text: string }> {
  const request = chat(key, body);
  for (const [name, value] of Object.entries(headers)) request.headers.set(name, value);
  const { response, body: text } = await send(config, request, (r) => r.text());
  return { response, text: text as string };
}

async function recordOf(config: string, key: string, response: Response): Promise<RequestRecord> {
  const id = response.headers.get("x-request-id") ?? "";
  const { body } = await send(config, get(key, `/v1/usage/requests/${id}`), (r) => r.json());
  return body as RequestRecord;
}

describe("the response cache", () => {
  it("answers a repeated deterministic request from the cache with the same bytes", async () => {
    const { key } = await createKey({ name: "cache-json" });
    const config = cached();
    const ttl = { "x-warmgate-cache-ttl": "60" };
    const first = await ask(config, key, { max_tokens: 20 }, ttl);
    expect(first.response.status).toBe(200);
    expect(first.response.headers.get("x-warmgate-cache")).toBe("MISS");
    // The same body with its fields in another order, and a default written out.
    const again = await ask(config, key, { max_tokens: 20, n: 1, top_p: 1 }, ttl);
    expect(again.response.headers.get("x-warmgate-cache")).toBe("HIT");
    expect(again.response.headers.get("content-type")).toContain("application/json");
    expect(again.text).toBe(first.text);
    const other = await ask(config, key, { max_tokens: 21 }, ttl);
    expect(other.response.headers.get("x-warmgate-cache")).toBe("MISS");
  });

  it("replays a sampled answer it was asked to keep, byte for byte, with no origin", async () => {
    const { key } = await createKey({ name: "cache-named" });
    const config = cached({ mode: "on" });
    const named = { "x-warmgate-cache-key": "greeting-v1" };
    const first = await ask(config, key, SAMPLED, named);
    // No origin is reachable: the answer can only come from the cache.
    const again = await ask(originsGone({ mode: "on" }), key, SAMPLED, named);
    expect(again.response.status).toBe(200);
    expect(again.response.headers.get("x-warmgate-cache")).toBe("HIT");
    expect(again.text).toBe(first.text);
    // Not asked for explicitly, a sampling request passes the cache by.
    const fresh = await ask(config, key, SAMPLED);
    expect(fresh.response.headers.get("x-warmgate-cache")).toBe("BYPASS");
  });

  it("replays a stream exactly as the origin wrote it, and never to a JSON request", async () => {
    const { key } = await createKey({ name: "cache-stream" });
    const config = cached({ mode: "on", sampled: true });
    const body = { ...SAMPLED, stream: true, stream_options: { include_usage: true } };
    const first = await ask(config, key, body);
    expect(first.response.headers.get("x-warmgate-cache")).toBe("MISS");
    expect(first.text).toContain("data: [DONE]");
    const again = await ask(originsGone({ mode: "on", sampled: true }), key, body);
    expect(again.response.status).toBe(200);
    expect(again.response.headers.get("x-warmgate-cache")).toBe("HIT");
    expect(again.response.headers.get("content-type")).toContain("text/event-stream");
    expect(again.text).toBe(first.text);
    const whole = await ask(config, key, { ...SAMPLED, stream: false });
    expect(whole.response.headers.get("x-warmgate-cache")).toBe("MISS");
    expect(() => JSON.parse(whole.text) as unknown).not.toThrow();
    // Without the usage chunk a stream's bytes differ: it is another entry.
    const bare = await ask(config, key, { ...SAMPLED, stream: true });
    expect(bare.response.headers.get("x-warmgate-cache")).toBe("MISS");
  });

  it.each([false, true])(
    "has kept a miss's entry by the time its answer ended (stream: %s)",
    async (stream) => {
      const { key } = await createKey({ name: `cache-at-end-${stream}` });
      const config = cached({ mode: "on" });
      const body = { max_tokens: 12, stream };
      // The first request's background work is not waited for: only the answer's end.
      const ctx = createExecutionContext();
      const first = await app.fetch(chat(key, body), { ...env, WARMGATE_CONFIG: config }, ctx);
      const text = await first.text();
      const again = await ask(config, key, body);
      expect(again.response.headers.get("x-warmgate-cache")).toBe("HIT");
      expect(again.text).toBe(text);
      await waitOnExecutionContext(ctx);
    },
  );

  it("never answers one key with another key's entry", async () => {
    const a = await createKey({ name: "cache-tenant-a" });
    const b = await createKey({ name: "cache-tenant-b" });
    const config = cached({ mode: "on" });
    await ask(config, a.key, { max_tokens: 9 });
    expect(
      (await ask(config, a.key, { max_tokens: 9 })).response.headers.get("x-warmgate-cache"),
    ).toBe("HIT");
    expect(
      (await ask(config, b.key, { max_tokens: 9 })).response.headers.get("x-warmgate-cache"),
    ).toBe("MISS");
  });

  it("keeps a browser token without `user` to its own entries, whatever its body says", async () => {
    const shop = "https://shop.example";
    const { key } = await createKey({ name: "cache-tokens", allowed_origins: [shop] });
    const config = cached({ mode: "on" });
    const mint = async () => {
      const request = new Request("http://edge.test/v1/tokens", {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: "{}",
      });
      const { response, body } = await send(config, request, (r) => r.json());
      expect(response.status).toBe(200);
      return (body as { token: string }).token;
    };
    const [a, b] = [await mint(), await mint()];
    const status = async (credential: string, body: Record<string, unknown>, web = true) =>
      (await ask(config, credential, body, web ? { origin: shop } : {})).response.headers.get(
        "x-warmgate-cache",
      );
    expect(await status(a, { max_tokens: 14 })).toBe("MISS");
    expect(await status(a, { max_tokens: 14 })).toBe("HIT");
    expect(await status(b, { max_tokens: 14 })).toBe("MISS");
    expect(await status(key, { max_tokens: 14 }, false)).toBe("MISS");
    // An end user the key's server names is not a token's to read by naming it too.
    expect(await status(key, { max_tokens: 15, user: "victim" }, false)).toBe("MISS");
    expect(await status(b, { max_tokens: 15, user: "victim" })).toBe("MISS");
  });

  it("shares entries between keys only where configured to", async () => {
    const a = await createKey({ name: "cache-shared-a" });
    const b = await createKey({ name: "cache-shared-b" });
    const config = cached({ mode: "on", rules: [{ model: "warmgate-sim-8b", scope: "shared" }] });
    await ask(config, a.key, { max_tokens: 11 });
    expect(
      (await ask(config, b.key, { max_tokens: 11 })).response.headers.get("x-warmgate-cache"),
    ).toBe("HIT");
  });

  it("shares entries within a team where configured to, never with a key outside it", async () => {
    const created = await app.fetch(
      new Request("http://edge.test/admin/teams", {
        method: "POST",
        headers: ADMIN,
        body: JSON.stringify({ name: "cache-team" }),
      }),
      env,
    );
    const team = await created.json<{ id: string }>();
    const a = await createKey({ name: "cache-team-a", team_id: team.id });
    const b = await createKey({ name: "cache-team-b", team_id: team.id });
    const outsider = await createKey({ name: "cache-team-outsider" });
    const config = cached({ mode: "on", scope: "team" });
    expect(
      (await ask(config, a.key, { max_tokens: 13 })).response.headers.get("x-warmgate-cache"),
    ).toBe("MISS");
    expect(
      (await ask(config, b.key, { max_tokens: 13 })).response.headers.get("x-warmgate-cache"),
    ).toBe("HIT");
    expect(
      (await ask(config, outsider.key, { max_tokens: 13 })).response.headers.get(
        "x-warmgate-cache",
      ),
    ).toBe("MISS");
  });

  it("follows the rules for one key, and the skip header", async () => {
    const { id, key } = await createKey({ name: "cache-rules" });
    const off = cached({ mode: "on", rules: [{ key: id, mode: "off" }] });
    await ask(off, key, { max_tokens: 8 });
    expect((await ask(off, key, { max_tokens: 8 })).response.headers.get("x-warmgate-cache")).toBe(
      "BYPASS",
    );
    const on = cached({ mode: "off", rules: [{ key: id, mode: "on" }] });
    await ask(on, key, { max_tokens: 8 });
    const skip = { "x-warmgate-skip-cache": "true" };
    expect(
      (await ask(on, key, { max_tokens: 8 }, skip)).response.headers.get("x-warmgate-cache"),
    ).toBe("BYPASS");
    expect((await ask(on, key, { max_tokens: 8 })).response.headers.get("x-warmgate-cache")).toBe(
      "HIT",
    );
    // `request` mode uses the cache only for requests that ask with a lifetime.
    expect(
      (await ask(cached(), key, { max_tokens: 8 })).response.headers.get("x-warmgate-cache"),
    ).toBe("BYPASS");
  });

  it("bills a hit at its configured share of the price, with the tokens it saved, and no origin", async () => {
    const { key } = await createKey({
      name: "cache-billing",
      budgets: [{ period: "1d", max_usd: 5 }],
    });
    const free = cached({ mode: "on" });
    const first = await ask(free, key, { max_tokens: 30 });
    const usage = (JSON.parse(first.text) as { usage: Parameters<typeof costOf>[0] }).usage;
    const hit = await ask(free, key, { max_tokens: 30 });
    expect(hit.response.headers.get("x-warmgate-cost-usd")).toBe("0.000000");
    const record = await recordOf(free, key, hit.response);
    expect(record).toMatchObject({
      outcome: "ok",
      cost_usd: 0,
      cache_hit: true,
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
      attempts: [],
    });
    const half = cached({ mode: "on", price_share: 0.5 });
    const halfHit = await ask(half, key, { max_tokens: 30 });
    expect(halfHit.response.headers.get("x-warmgate-cache")).toBe("HIT");
    const full = costOf(usage, SMALL);
    const billed = usdPicos((await recordOf(half, key, halfHit.response)).cost_usd);
    expect(billed).toBe(full / 2n);
    const miss = await recordOf(free, key, first.response);
    expect(miss).toMatchObject({ cache_hit: false });
  });

  it("serves an entry only for its lifetime", async () => {
    const { key } = await createKey({ name: "cache-ttl" });
    const config = cached();
    const short = { "x-warmgate-cache-ttl": "1" };
    await ask(config, key, { max_tokens: 7 }, short);
    expect(
      (await ask(config, key, { max_tokens: 7 }, short)).response.headers.get("x-warmgate-cache"),
    ).toBe("HIT");
    await scheduler.wait(1_100);
    expect(
      (await ask(config, key, { max_tokens: 7 }, short)).response.headers.get("x-warmgate-cache"),
    ).toBe("MISS");
  });

  it.each([
    ["x-warmgate-cache-ttl", "soon"],
    ["x-warmgate-cache-ttl", "0"],
    ["x-warmgate-cache-ttl", "86401"],
    ["x-warmgate-skip-cache", "yes"],
    ["x-warmgate-cache-key", "two words"],
  ])("refuses %s: %s with OpenAI's 400", async (name, value) => {
    const { key } = await createKey({ name: "cache-bad-header" });
    const { response, text } = await ask(cached(), key, {}, { [name]: value });
    expect(response.status).toBe(400);
    const { error } = JSON.parse(text) as ErrorBody;
    expect(error).toMatchObject({
      type: "invalid_request_error",
      code: "invalid_value",
      param: name,
    });
    expect(error.message).toContain(name);
  });

  it("counts hits, misses, bytes and tokens saved per model and key in /metrics", async () => {
    const { id, key } = await createKey({ name: "cache-metrics" });
    const config = cached({ mode: "on" });
    await ask(config, key, { max_tokens: 5 });
    const hit = await ask(config, key, { max_tokens: 5 });
    const scrape = await send(config, edgeRequest("/metrics", { headers: ADMIN }), (r) => r.text());
    const text = scrape.body as string;
    const labels = `key="${id}",name="cache-metrics"`;
    expect(metricValue(text, "warmgate_key_cache_requests_total", `${labels},result="hit"`)).toBe(
      1,
    );
    expect(metricValue(text, "warmgate_key_cache_requests_total", `${labels},result="miss"`)).toBe(
      1,
    );
    expect(metricValue(text, "warmgate_key_cache_saved_bytes_total", labels)).toBe(hit.text.length);
    expect(metricValue(text, "warmgate_key_cache_saved_tokens_total", labels)).toBeGreaterThan(0);
    expect(
      metricValue(text, "warmgate_cache_requests_total", 'model="warmgate-sim-8b",result="hit"'),
    ).toBeGreaterThanOrEqual(1);
  });
});
