import { describe, expect, it } from "vitest";
import { answeredFor, originBook } from "../../../durable-objects/key-account/reconcile.ts";

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
    expect(originBook(JSON.stringify(config)).sources).toEqual([
      { id: "eu-1", url: "https://eu-1.example", credentials: ["EU1_TOKEN", "EU1_NEXT"] },
      { id: "eu-2", url: "https://eu-2.example" },
      { id: "us-1", url: "https://us-1.example" },
    ]);
  });

  it("asks no origin under a configuration the edge could not load either", () => {
    expect(originBook(undefined).sources).toEqual([]);
    expect(originBook("{").sources).toEqual([]);
    expect(originBook(JSON.stringify({ ...config, default_region: "mars" })).sources).toEqual([]);
  });

  it("waits for the origins a request's attempts ran on, or all of them when it cannot tell", () => {
    const book = originBook(JSON.stringify(config));
    const silent = new Set(["https://us-1.example"]);
    const served = { region: "eu", origin: "eu-1", result: "served" as const };
    const failed = { region: "us", origin: "us-1", result: "failed" as const };
    // An origin it never touched, down for good, does not hold its bill for ten minutes.
    expect(answeredFor([served], silent, book)).toBe(true);
    expect(answeredFor([failed, served], silent, book)).toBe(false);
    // An attempt naming no origin may have run on any of its region's.
    expect(answeredFor([{ ...failed, origin: null }, served], silent, book)).toBe(false);
    expect(answeredFor([{ ...served, origin: null }], silent, book)).toBe(true);
    // A lapsed request's edge told no attempt: every origin is waited for.
    expect(answeredFor([], silent, book)).toBe(false);
    expect(answeredFor([], new Set(), book)).toBe(true);
  });

  it("knows an origin listed under two ids is silent under both", () => {
    const shared = structuredClone(config);
    shared.regions[1]?.origins.push({ id: "us-2", url: "https://eu-2.example" });
    const book = originBook(JSON.stringify(shared));
    expect(book.sources.map((s) => s.url)).toEqual([
      "https://eu-1.example",
      "https://eu-2.example",
      "https://us-1.example",
    ]);
    const silent = new Set(["https://eu-2.example"]);
    expect(answeredFor([{ region: "eu", origin: "eu-2", result: "served" }], silent, book)).toBe(
      false,
    );
    expect(answeredFor([{ region: "us", origin: "us-2", result: "served" }], silent, book)).toBe(
      false,
    );
  });
});
