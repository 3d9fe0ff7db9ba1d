import { describe, expect, it } from "vitest";
import { answeredFor, outcomeSources } from "../../../durable-objects/key-account/reconcile.ts";

const config = {
  models: [{ id: "m", max_model_len: 1024 }],
  regions: [
    {
      id: "eu",
      origins: [
        { id: "eu-1", url: "https://eu-1.example/", credentials: ["EU1_TOKEN", "EU1_NEXT"] },
        { id: "eu-2", url: "https://eu-2.example" },
      ],
    },
    { id: "us", origins: [{ id: "us-1", url: "https://us-1.example" }] },
  ],
  default_region: "eu",
};

describe("where a key's account asks how lapsed requests ended", () => {
  it("asks every origin of the configuration, with its credentials' names", () => {
    expect(outcomeSources(JSON.stringify(config))).toEqual([
      { id: "eu-1", url: "https://eu-1.example", credentials: ["EU1_TOKEN", "EU1_NEXT"] },
      { id: "eu-2", url: "https://eu-2.example" },
      { id: "us-1", url: "https://us-1.example" },
    ]);
  });

  it("asks no origin under a configuration the edge could not load either", () => {
    expect(outcomeSources(undefined)).toEqual([]);
    expect(outcomeSources("{")).toEqual([]);
    expect(outcomeSources(JSON.stringify({ ...config, default_region: "mars" }))).toEqual([]);
  });

  it("waits for the origins a request's attempts ran on, or all of them when it cannot tell", () => {
    const silent = new Set(["us-1"]);
    const served = { region: "eu", origin: "eu-1", result: "served" as const };
    const failed = { region: "us", origin: "us-1", result: "failed" as const };
    // An origin it never touched, down for good, does not hold its bill for ten minutes.
    expect(answeredFor([served], silent)).toBe(true);
    expect(answeredFor([failed, served], silent)).toBe(false);
    // A lapsed request's edge told no attempt; a Batcher's failure may name no origin.
    expect(answeredFor([], silent)).toBe(false);
    expect(answeredFor([{ ...failed, origin: null }, served], silent)).toBe(false);
    expect(answeredFor([], new Set())).toBe(true);
  });
});
