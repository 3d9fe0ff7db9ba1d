import { describe, expect, it } from "vitest";
import { CacheSectionSchema, cacheSettings } from "../../../contracts/config/cache.ts";
import {
  type CacheHeaders,
  cacheDecision,
  readCacheHeaders,
} from "../../../functions/cache/policy.ts";

const NONE: CacheHeaders = { ttlSeconds: null, skip: false, customKey: null };

function settingsFor(section: unknown, key = "key_a", model = "m") {
  return cacheSettings(CacheSectionSchema.parse(section), key, model);
}

function read(headers: Record<string, string>) {
  return readCacheHeaders((name) => headers[name], 3_600);
}

describe("readCacheHeaders", () => {
  it("reads a lifetime, the skip flag and a custom key", () => {
    expect(
      read({
        "x-warmgate-cache-ttl": "60",
        "x-warmgate-skip-cache": "TRUE",
        "x-warmgate-cache-key": "faq:1",
      }),
    ).toEqual({ ok: true, headers: { ttlSeconds: 60, skip: true, customKey: "faq:1" } });
    expect(read({})).toEqual({ ok: true, headers: NONE });
  });

  it.each([
    ["x-warmgate-cache-ttl", "1.5"],
    ["x-warmgate-cache-ttl", "-1"],
    ["x-warmgate-cache-ttl", "3601"],
    ["x-warmgate-skip-cache", "1"],
    ["x-warmgate-cache-key", "é"],
    ["x-warmgate-cache-key", "x".repeat(257)],
  ])("refuses %s: %s", (name, value) => {
    expect(read({ [name]: value })).toMatchObject({ ok: false, error: { status: 400 } });
  });
});

describe("cacheDecision", () => {
  const chat = { temperature: 0 };

  it("uses the cache in `request` mode only when the request names a lifetime", () => {
    const settings = settingsFor({});
    expect(cacheDecision(settings, NONE, "chat", chat)).toEqual({
      use: false,
      reason: "not_asked",
    });
    expect(cacheDecision(settings, { ...NONE, ttlSeconds: 9 }, "chat", chat)).toEqual({
      use: true,
      ttlSeconds: 9,
      customKey: null,
    });
  });

  it("passes by requests that sample unless asked for them", () => {
    const on = settingsFor({ mode: "on" });
    expect(cacheDecision(on, NONE, "chat", {})).toEqual({ use: false, reason: "sampled" });
    expect(cacheDecision(on, { ...NONE, customKey: "k" }, "chat", {}).use).toBe(true);
    expect(cacheDecision(settingsFor({ mode: "on", sampled: true }), NONE, "chat", {}).use).toBe(
      true,
    );
  });

  it("never uses it when off or skipped", () => {
    const headers = { ...NONE, ttlSeconds: 5 };
    expect(cacheDecision(settingsFor({ mode: "off" }), headers, "chat", chat).use).toBe(false);
    expect(
      cacheDecision(settingsFor({ mode: "on" }), { ...NONE, skip: true }, "chat", chat),
    ).toEqual({ use: false, reason: "skipped" });
  });
});

describe("cacheSettings", () => {
  const section = {
    mode: "off",
    rules: [
      { model: "m", mode: "on", ttl_seconds: 60 },
      { key: "key_a", price_share: 0.25 },
      { key: "key_a", model: "m", scope: "shared" },
    ],
  };

  it("applies the rules for a key and model in order, field by field", () => {
    expect(settingsFor(section, "key_a", "m")).toMatchObject({
      mode: "on",
      ttlSeconds: 60,
      pricePpm: 250_000,
      scope: "shared",
    });
    expect(settingsFor(section, "key_b", "m")).toMatchObject({
      mode: "on",
      pricePpm: 0,
      scope: "key",
    });
    expect(settingsFor(section, "key_a", "other")).toMatchObject({
      mode: "off",
      pricePpm: 250_000,
    });
  });

  it("refuses a rule for nothing and a price share finer than a millionth", () => {
    expect(CacheSectionSchema.safeParse({ rules: [{ mode: "on" }] }).success).toBe(false);
    expect(CacheSectionSchema.safeParse({ price_share: 0.1234567 }).success).toBe(false);
    expect(CacheSectionSchema.safeParse({ price_share: 1.5 }).success).toBe(false);
  });
});

describe("the cache section in WARMGATE_CONFIG", () => {
  it("refuses a rule for a model that is not configured", async () => {
    const { GatewayConfigSchema } = await import("../../../contracts/config/gateway.ts");
    const config = {
      models: [{ id: "m", max_model_len: 100 }],
      regions: [{ id: "eu", origins: [{ id: "eu-1", url: "http://127.0.0.1:1" }] }],
      default_region: "eu",
      cache: { rules: [{ model: "nope", mode: "on" }] },
    };
    const result = GatewayConfigSchema.safeParse(config);
    expect(result.success).toBe(false);
    expect(result.error?.issues[0]?.path).toEqual(["cache", "rules", 0, "model"]);
    const valid = { ...config, cache: { rules: [{ model: "m", mode: "on" }] } };
    expect(GatewayConfigSchema.parse(valid).cache.rules).toHaveLength(1);
  });
});
