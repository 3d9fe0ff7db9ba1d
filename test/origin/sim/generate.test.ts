import { describe, expect, it } from "vitest";
import { planOutput, TOOL_CALL_TOKEN, type PlanOptions } from "../../../origin/sim/generate.ts";
import { countTokens, tokenize } from "../../../origin/sim/tokenizer.ts";

function plan(overrides: Partial<PlanOptions>) {
  return planOutput({
    seed: 1,
    maxTokens: 256,
    stop: [],
    mode: { kind: "text" },
    ignoreEos: false,
    ...overrides,
  });
}

describe("planOutput", () => {
  it("generates text whose token count is exactly the tokens it reports", () => {
    for (let seed = 0; seed < 200; seed++) {
      const out = plan({ seed, maxTokens: 1 + (seed % 150) });
      expect(countTokens(out.text)).toBe(out.ids.length);
      expect(tokenize(out.text)).toEqual(out.ids);
      expect(out.deltas.join("")).toBe(out.text);
    }
  });

  it("ends some answers naturally and cuts others at max_tokens", () => {
    const reasons = new Set<string>();
    for (let seed = 0; seed < 100; seed++) {
      const out = plan({ seed, maxTokens: 100 });
      reasons.add(out.finishReason);
      expect(out.ids.length).toBeLessThanOrEqual(100);
      // A natural end closes a sentence; a cut one has used every allowed token.
      expect(out.finishReason === "stop" ? out.text.endsWith(".") : out.ids.length === 100).toBe(
        true,
      );
    }
    expect(reasons).toEqual(new Set(["stop", "length"]));
  });

  it("generates exactly max_tokens when told to ignore the end of sequence", () => {
    const out = plan({ maxTokens: 777, ignoreEos: true });
    expect(out.ids).toHaveLength(777);
    expect(out.finishReason).toBe("length");
  });

  it("gives the same tokens for the same seed and different ones for another seed", () => {
    expect(plan({ seed: 42 })).toEqual(plan({ seed: 42 }));
    expect(plan({ seed: 42 }).text).not.toBe(plan({ seed: 43 }).text);
  });

  it("cuts the output before a stop string and finishes with stop", () => {
    const full = plan({ seed: 7, ignoreEos: true, maxTokens: 200 });
    const word = full.text.split(" ")[5] ?? "";
    const out = plan({ seed: 7, ignoreEos: true, maxTokens: 200, stop: ["zzz", ` ${word}`] });
    expect(out.finishReason).toBe("stop");
    expect(out.text).toBe(full.text.slice(0, full.text.indexOf(` ${word}`)));
    expect(out.deltas.join("")).toBe(out.text);
    expect(out.ids.length).toBeLessThan(full.ids.length);
  });

  it("writes valid JSON in json mode, following a schema when given one", () => {
    for (let seed = 0; seed < 20; seed++) {
      const free = plan({ seed, mode: { kind: "json", schema: null }, maxTokens: 1000 });
      expect(free.finishReason).toBe("stop");
      expect(JSON.parse(free.text)).toHaveProperty("answer");
      const schema = {
        type: "object",
        properties: {
          name: { type: "string" },
          age: { type: "integer" },
          tags: { type: "array", items: { type: "string" } },
          kind: { enum: ["a", "b"] },
        },
      };
      const typed: unknown = JSON.parse(
        plan({ seed, mode: { kind: "json", schema }, maxTokens: 1000 }).text,
      );
      expect(typed).toEqual({
        name: expect.any(String),
        age: expect.any(Number),
        tags: expect.any(Array),
        kind: expect.stringMatching(/^[ab]$/),
      });
    }
  });

  it("plans a tool call with JSON arguments that fit the function's parameters", () => {
    const out = plan({
      mode: {
        kind: "tool",
        name: "get_weather",
        parameters: {
          type: "object",
          properties: { city: { type: "string" }, days: { type: "integer" } },
        },
      },
    });
    expect(out.finishReason).toBe("tool_calls");
    expect(out.ids[0]).toBe(TOOL_CALL_TOKEN);
    expect(out.toolCall?.name).toBe("get_weather");
    expect(out.toolCall?.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    expect(JSON.parse(out.toolCall?.arguments ?? "")).toEqual({
      city: expect.any(String),
      days: expect.any(Number),
    });
    expect(out.ids.length).toBe(1 + countTokens(out.toolCall?.arguments ?? ""));
  });
});
