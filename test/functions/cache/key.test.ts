import { describe, expect, it } from "vitest";
import {
  type CacheKeyInput,
  cacheKey,
  cacheKeyMaterial,
  canonicalJson,
  isDeterministic,
  normalisedBody,
} from "../../../functions/cache/key.ts";

const MESSAGES = [{ role: "user", content: "Hi" }];

function input(overrides: Partial<CacheKeyInput> = {}): CacheKeyInput {
  return {
    kind: "chat",
    body: { model: "m", messages: MESSAGES, temperature: 0 },
    delivery: "whole",
    scope: { kind: "key", keyId: "key_a", endUser: null },
    customKey: null,
    ...overrides,
  };
}

describe("normalisedBody", () => {
  it("reads bodies alike whatever their field order, at every depth", () => {
    const a = { model: "m", messages: [{ role: "user", content: "Hi" }], temperature: 0 };
    const b = { temperature: 0, messages: [{ content: "Hi", role: "user" }], model: "m" };
    expect(normalisedBody("chat", a, "whole")).toBe(normalisedBody("chat", b, "whole"));
  });

  it("reads a default written out, or a null, as the field left out", () => {
    const bare = normalisedBody("chat", { model: "m", messages: MESSAGES }, "whole");
    const written = { model: "m", messages: MESSAGES, n: 1, top_p: 1, user: null, logprobs: false };
    expect(normalisedBody("chat", written, "whole")).toBe(bare);
    expect(normalisedBody("chat", { model: "m", messages: MESSAGES, n: 2 }, "whole")).not.toBe(
      bare,
    );
  });

  it("keeps array order and every value that changes the answer", () => {
    const one = normalisedBody("chat", { model: "m", messages: [1, 2] }, "whole");
    expect(normalisedBody("chat", { model: "m", messages: [2, 1] }, "whole")).not.toBe(one);
    expect(normalisedBody("chat", { model: "m", messages: [1, 2], seed: 3 }, "whole")).not.toBe(
      one,
    );
  });

  it("drops the stream flag, and the stream options of a whole answer", () => {
    const whole = normalisedBody("chat", { model: "m", stream: false }, "whole");
    expect(
      normalisedBody(
        "chat",
        { model: "m", stream: true, stream_options: { include_usage: true } },
        "whole",
      ),
    ).toBe(whole);
    const usage = { model: "m", stream: true, stream_options: { include_usage: true } };
    expect(normalisedBody("chat", usage, "stream")).toContain("include_usage");
    const off = { model: "m", stream: true, stream_options: { include_usage: false } };
    expect(normalisedBody("chat", off, "stream")).toBe(
      normalisedBody("chat", { model: "m" }, "stream"),
    );
  });

  it("applies each API's own defaults", () => {
    expect(normalisedBody("completion", { model: "m", best_of: 1 }, "whole")).toBe(
      normalisedBody("completion", { model: "m" }, "whole"),
    );
    expect(normalisedBody("chat", { model: "m", best_of: 1 }, "whole")).not.toBe(
      normalisedBody("chat", { model: "m" }, "whole"),
    );
    expect(normalisedBody("embeddings", { model: "m", encoding_format: "float" }, "whole")).toBe(
      normalisedBody("embeddings", { model: "m" }, "whole"),
    );
  });

  it("keeps max_tokens: engines default it as they please (16 is OpenAI's, not every engine's)", () => {
    for (const kind of ["completion", "chat"] as const) {
      expect(normalisedBody(kind, { model: "m", max_tokens: 16 }, "whole")).not.toBe(
        normalisedBody(kind, { model: "m" }, "whole"),
      );
    }
  });
});

describe("cacheKeyMaterial", () => {
  it("tells apart deliveries, routes, tenants (keys, teams, shared) and end users", () => {
    const base = cacheKeyMaterial(input());
    const variants = [
      input({ delivery: "stream" }),
      input({ kind: "completion" }),
      input({ scope: { kind: "key", keyId: "key_b", endUser: null } }),
      input({ scope: { kind: "key", keyId: "key_a", endUser: "alice" } }),
      input({ scope: { kind: "shared" } }),
      input({ scope: { kind: "team", teamId: "key_a", endUser: null } }),
      input({ scope: { kind: "team", teamId: "team_b", endUser: "alice" } }),
    ].map(cacheKeyMaterial);
    expect(new Set([base, ...variants]).size).toBe(variants.length + 1);
  });

  it("names an entry by the caller's key instead of the body, within its model and tenant", () => {
    const named = (body: Record<string, unknown>) =>
      cacheKeyMaterial(input({ body, customKey: "faq-1" }));
    expect(named({ model: "m", messages: [1] })).toBe(named({ model: "m", messages: [2] }));
    expect(named({ model: "m" })).not.toBe(named({ model: "other" }));
    expect(cacheKeyMaterial(input({ customKey: "faq-1", delivery: "stream" }))).not.toBe(
      cacheKeyMaterial(
        input({
          customKey: "faq-1",
          delivery: "stream",
          body: { model: "m", stream_options: { include_usage: true } },
        }),
      ),
    );
  });

  it("cannot be forged across tenants with characters of a key id", () => {
    const a = cacheKeyMaterial(input({ scope: { kind: "key", keyId: 'a","b', endUser: null } }));
    const b = cacheKeyMaterial(input({ scope: { kind: "key", keyId: "a", endUser: "b" } }));
    expect(a).not.toBe(b);
  });

  it("hashes to 64 hex digits, the same for the same material", async () => {
    const key = await cacheKey(input());
    expect(key).toMatch(/^[0-9a-f]{64}$/);
    expect(
      await cacheKey(input({ body: { temperature: 0, messages: MESSAGES, model: "m" } })),
    ).toBe(key);
  });
});

describe("canonicalJson", () => {
  it("sorts keys by code point and keeps JSON's escapes", () => {
    expect(canonicalJson({ b: 1, a: [{ d: "\n", c: null }], B: true })).toBe(
      '{"B":true,"a":[{"c":null,"d":"\\n"}],"b":1}',
    );
  });
});

describe("isDeterministic", () => {
  it("holds for temperature 0, a seed, or an embedding", () => {
    expect(isDeterministic("chat", { temperature: 0 })).toBe(true);
    expect(isDeterministic("completion", { seed: 4, temperature: 1.2 })).toBe(true);
    expect(isDeterministic("embeddings", {})).toBe(true);
    expect(isDeterministic("chat", {})).toBe(false);
    expect(isDeterministic("responses", { temperature: 0.7 })).toBe(false);
  });
});
