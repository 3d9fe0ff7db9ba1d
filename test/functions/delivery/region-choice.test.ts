import { describe, expect, it } from "vitest";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { DEFAULT_QUARANTINE_MS } from "../../../contracts/origin-health.ts";
import { OriginPool } from "../../../functions/delivery/origin-pool.ts";
import { nearestRegion, regionOrder } from "../../../functions/delivery/region-choice.ts";

const config = loadConfig(
  JSON.stringify({
    models: [
      { id: "a", max_model_len: 100 },
      { id: "b", max_model_len: 100 },
    ],
    regions: [
      {
        id: "eu",
        continents: ["EU", "AF"],
        countries: ["IL"],
        colos: [],
        origins: [
          { id: "eu-1", url: "http://eu-1" },
          { id: "eu-2", url: "http://eu-2" },
          { id: "eu-3", url: "http://eu-3", models: ["b"] },
        ],
      },
      {
        id: "us",
        continents: ["NA"],
        colos: ["FRA"],
        origins: [{ id: "us-1", url: "http://us-1" }],
      },
      { id: "ap", continents: ["AS"], origins: [{ id: "ap-1", url: "http://ap-1" }] },
    ],
    default_region: "us",
  }),
);

const ids = (regions: { id: string }[]) => regions.map((r) => r.id);

describe("nearest region", () => {
  it("maps a continent to its region", () => {
    expect(nearestRegion(config, { continent: "AS" }).id).toBe("ap");
  });

  it("prefers a country mapping over the continent", () => {
    expect(nearestRegion(config, { continent: "AS", country: "IL" }).id).toBe("eu");
  });

  it("prefers a colo mapping over country and continent", () => {
    expect(nearestRegion(config, { colo: "FRA", country: "DE", continent: "EU" }).id).toBe("us");
  });

  it("falls back to the default region for an unknown or missing location", () => {
    expect(nearestRegion(config, { continent: "OC" }).id).toBe("us");
    expect(nearestRegion(config, {}).id).toBe("us");
  });
});

describe("region order", () => {
  it("tries the nearest region first, then the rest in config order", () => {
    const order = regionOrder(config, { continent: "AS" });
    expect(order.kind === "ok" && ids(order.regions)).toEqual(["ap", "eu", "us"]);
  });

  it("lets the override header pick the first region", () => {
    const order = regionOrder(config, { continent: "AS" }, "us");
    expect(order.kind === "ok" && ids(order.regions)).toEqual(["us", "eu", "ap"]);
  });

  it("reports an override naming no region", () => {
    expect(regionOrder(config, {}, "mars")).toEqual({ kind: "unknown_region", region: "mars" });
  });
});

describe("origin pool", () => {
  const regions = config.regions;
  const origins = (pool: OriginPool, model: string, now = 0) =>
    pool.candidates(regions, model, now).map((c) => c.origin.id);

  it("lists only origins serving the model, region by region", () => {
    const pool = new OriginPool();
    expect(origins(pool, "a").slice(2)).toEqual(["us-1", "ap-1"]);
    expect(origins(pool, "a").slice(0, 2).sort()).toEqual(["eu-1", "eu-2"]);
    expect(origins(pool, "b")).toHaveLength(5);
  });

  it("rotates equally loaded origins so requests spread round robin", () => {
    const pool = new OriginPool();
    const firsts = [0, 1, 2, 3].map(() => origins(pool, "a")[0]);
    expect(firsts).toEqual(["eu-1", "eu-2", "eu-1", "eu-2"]);
  });

  it("puts the origin with fewer requests in flight first", () => {
    const pool = new OriginPool();
    pool.begin("eu-1");
    pool.begin("eu-1");
    pool.begin("eu-2");
    expect(origins(pool, "a")[0]).toBe("eu-2");
    pool.end("eu-1");
    pool.end("eu-1");
    expect(origins(pool, "a")[0]).toBe("eu-1");
  });

  it("tries a recently failed origin only after every healthy one, until the quarantine ends", () => {
    const pool = new OriginPool();
    pool.reportFailure("eu-1", 1_000);
    expect(origins(pool, "a", 1_000)).toEqual(["eu-2", "us-1", "ap-1", "eu-1"]);
    expect(origins(pool, "a", 1_000 + DEFAULT_QUARANTINE_MS)).toContain("eu-1");
    expect(origins(pool, "a", 1_000 + DEFAULT_QUARANTINE_MS).at(-1)).toBe("ap-1");
  });

  it("clears the quarantine when the origin answers again", () => {
    const pool = new OriginPool();
    pool.reportFailure("eu-1", 0);
    pool.reportSuccess("eu-1");
    expect(origins(pool, "a", 1).at(-1)).toBe("ap-1");
  });
});
