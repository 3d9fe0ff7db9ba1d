import { describe, expect, it } from "vitest";
import { outcomeSources } from "../../../durable-objects/key-account/reconcile.ts";

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
});
