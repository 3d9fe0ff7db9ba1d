import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../../contracts/config/gateway.ts";
import { resolveModel, resolveModels } from "../../../contracts/config/models.ts";
import { batchingPlan } from "../../../contracts/config/plans.ts";

const valid = {
  models: [
    { id: "m-8b", max_model_len: 32768, aliases: ["fast"] },
    { id: "m-70b", max_model_len: 8192 },
  ],
  regions: [
    { id: "eu", continents: ["EU"], origins: [{ id: "eu-1", url: "http://127.0.0.1:40001" }] },
    {
      id: "us",
      origins: [{ id: "us-1", url: "https://us.example.com", models: ["m-70b"] }],
    },
  ],
  default_region: "eu",
};

const DEFAULT_LIMITS = {
  maxBodyBytes: 8 * 1024 * 1024,
  firstByteTimeoutMs: 30_000,
  requestTimeoutMs: 600_000,
  retryBudget: 2,
  retryRatio: 0.1,
  retryFloor: 10,
};

function problem(config: unknown): ConfigError {
  try {
    loadConfig(typeof config === "string" ? config : JSON.stringify(config));
  } catch (error) {
    if (error instanceof ConfigError) return error;
    throw error;
  }
  throw new Error("config was accepted");
}

describe("gateway configuration", () => {
  it("fills in default limits, owners and location lists", () => {
    const config = loadConfig(JSON.stringify(valid));
    expect(config.limits).toEqual(DEFAULT_LIMITS);
    expect(config.limits.maxBodyBytes).toBeGreaterThanOrEqual(8 * 1024 * 1024);
    expect(config.models[1]).toEqual({
      id: "m-70b",
      maxModelLen: 8192,
      ownedBy: "warmgate",
      aliases: [],
      price: { inputMicrosPerMtok: 0, cachedInputMicrosPerMtok: 0, outputMicrosPerMtok: 0 },
    });
    expect(config.regions[1]).toMatchObject({ continents: [], countries: [], colos: [] });
  });

  it("keeps limits the operator sets and defaults the rest", () => {
    const config = loadConfig(JSON.stringify({ ...valid, limits: { retry_budget: 0 } }));
    expect(config.limits).toEqual({ ...DEFAULT_LIMITS, retryBudget: 0 });
  });

  it("names the field of a wrong type", () => {
    const error = problem({ ...valid, models: [{ id: "m", max_model_len: "big" }] });
    expect(error.field).toBe("models[0].max_model_len");
    expect(error.message).toContain("models[0].max_model_len");
  });

  it("refuses a token hold share outside 0..1 and a negative longest hold", () => {
    expect(problem({ ...valid, batching: { hold_share: 1.5 } }).field).toBe("batching.hold_share");
    expect(problem({ ...valid, batching: { max_hold_ms: -1 } }).field).toBe("batching.max_hold_ms");
    const config = loadConfig(
      JSON.stringify({ ...valid, batching: { hold_share: 0, max_hold_ms: 25 } }),
    );
    const region = config.regions[0];
    if (region === undefined) throw new Error("no region");
    expect(batchingPlan(config, region, "m-8b")?.setup.window).toMatchObject({
      holdShare: 0,
      maxHoldMs: 25,
    });
  });

  it("names a missing field", () => {
    const { default_region: _, ...rest } = valid;
    expect(problem(rest).field).toBe("default_region");
  });

  it("refuses an origin URL that is not http(s)", () => {
    const regions = [{ id: "eu", origins: [{ id: "eu-1", url: "ftp://x" }] }];
    expect(problem({ ...valid, regions }).field).toBe("regions[0].origins[0].url");
  });

  it("refuses a default region that does not exist", () => {
    const error = problem({ ...valid, default_region: "mars" });
    expect(error.field).toBe("default_region");
    expect(error.message).toContain('unknown region "mars"');
  });

  it("refuses an origin serving a model that is not configured", () => {
    const regions = [{ id: "eu", origins: [{ id: "eu-1", url: "http://a", models: ["nope"] }] }];
    expect(problem({ ...valid, regions }).field).toBe("regions[0].origins[0].models[0]");
  });

  it("refuses duplicate origin ids across regions", () => {
    const regions = [
      { id: "eu", origins: [{ id: "o", url: "http://a" }] },
      { id: "us", origins: [{ id: "o", url: "http://b" }] },
    ];
    expect(problem({ ...valid, regions }).field).toBe("regions[1].origins[0].id");
  });

  it("refuses an alias that shadows a model id", () => {
    const models = [
      { id: "a", max_model_len: 1, aliases: ["b"] },
      { id: "b", max_model_len: 1 },
    ];
    expect(problem({ ...valid, models }).field).toBe("models[0].aliases[0]");
  });

  it("refuses unknown fields, which are typos in operator config", () => {
    expect(problem({ ...valid, regoins: [] }).message).toContain("regoins");
  });

  it("says when the text is not JSON or not set", () => {
    expect(problem("{models:").message).toMatch(/^WARMGATE_CONFIG is not valid JSON/);
    expect(() => loadConfig(undefined)).toThrow("WARMGATE_CONFIG is not set");
  });

  it("parses the same text once and keeps failing the same way for bad text", () => {
    const text = JSON.stringify(valid);
    expect(loadConfig(text)).toBe(loadConfig(text));
    expect(() => loadConfig("[]")).toThrow(ConfigError);
    expect(() => loadConfig("[]")).toThrow(ConfigError);
  });

  it("resolves an alias to its model and an id to itself", () => {
    const config = loadConfig(JSON.stringify(valid));
    expect(resolveModel(config, "fast")?.id).toBe("m-8b");
    expect(resolveModel(config, "m-70b")?.id).toBe("m-70b");
    expect(resolveModel(config, "gpt-4")).toBeUndefined();
  });
});

describe("prices and aliases", () => {
  const priced = {
    ...valid,
    models: [
      {
        id: "m-8b",
        max_model_len: 32768,
        pricing: { input_per_mtok: 0.15, output_per_mtok: 0.6 },
      },
      {
        id: "m-70b",
        max_model_len: 8192,
        pricing: { input_per_mtok: 2.5, cached_input_per_mtok: 1.25, output_per_mtok: 10 },
      },
    ],
    aliases: { cheap: ["m-8b"], best: ["m-70b", "m-8b"] },
  };

  it("turns prices into exact integer micro-dollars per 1M tokens, cached defaulting to input", () => {
    const config = loadConfig(JSON.stringify(priced));
    expect(config.models.map((model) => model.price)).toEqual([
      {
        inputMicrosPerMtok: 150_000,
        cachedInputMicrosPerMtok: 150_000,
        outputMicrosPerMtok: 600_000,
      },
      {
        inputMicrosPerMtok: 2_500_000,
        cachedInputMicrosPerMtok: 1_250_000,
        outputMicrosPerMtok: 10_000_000,
      },
    ]);
    expect(loadConfig(JSON.stringify(valid)).models[0]?.price).toEqual({
      inputMicrosPerMtok: 0,
      cachedInputMicrosPerMtok: 0,
      outputMicrosPerMtok: 0,
    });
  });

  it("refuses a price that is negative or finer than a micro-dollar", () => {
    for (const price of [-1, 0.0000001]) {
      const bad = structuredClone(priced);
      (bad.models[0] as { pricing: { input_per_mtok: number } }).pricing.input_per_mtok = price;
      expect(problem(bad).field).toBe("models[0].pricing.input_per_mtok");
    }
  });

  it("resolves an alias to its models in order, an id and a model's own alias to one", () => {
    const config = loadConfig(
      JSON.stringify({
        ...priced,
        models: [{ ...priced.models[0], aliases: ["small"] }, priced.models[1]],
      }),
    );
    expect(resolveModels(config, "best").map((m) => m.id)).toEqual(["m-70b", "m-8b"]);
    expect(resolveModels(config, "m-70b").map((m) => m.id)).toEqual(["m-70b"]);
    expect(resolveModels(config, "small").map((m) => m.id)).toEqual(["m-8b"]);
    expect(resolveModels(config, "nope")).toEqual([]);
    expect(resolveModel(config, "best")?.id).toBe("m-70b");
  });

  it("refuses an alias that is a model id, lists an unknown model or a model twice", () => {
    expect(problem({ ...priced, aliases: { "m-8b": ["m-70b"] } }).message).toMatch(
      /is also a model id/,
    );
    expect(problem({ ...priced, aliases: { fast: ["m-8b", "gone"] } }).field).toBe(
      "aliases.fast[1]",
    );
    expect(problem({ ...priced, aliases: { fast: ["m-8b", "m-8b"] } }).message).toMatch(
      /listed twice/,
    );
    expect(problem({ ...priced, aliases: { fast: [] } }).field).toBe("aliases.fast");
  });
});
