import * as fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  estimateChatPromptTokens,
  estimateCompletionPromptTokens,
  estimateTextTokens,
} from "../../../functions/request/token-estimate.ts";
import {
  ChatCompletionRequestSchema,
  CompletionRequestSchema,
} from "../../../functions/request/openai-schemas.ts";
import { tokenize } from "../../../origin/sim/tokenizer.ts";

// Samples of the text kinds that reach a gateway: prose, code, numbers, JSON, other scripts.
const SAMPLES = [
  "The quick brown fox jumps over the lazy dog. Internationalization is hard.",
  "function add(a, b) {\n    return a + b;\n}\n\nconsole.log(add(1234567, 89));",
  '{"user_id": 9912345, "items": [{"sku": "AB-12", "qty": 3}], "total": 1049.99}',
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "東京は日本の首都です。人口は約一千四百万人です。",
  "Emoji 🎉🚀 and accents: café, naïve, Zürich — “quotes”…",
  "a".repeat(1000),
  "   indented\n\t\ttabs\n\n\n\nmany blank lines",
];

// The estimate's definition, matched piece by piece over the whole text.
function piecewiseEstimate(text: string): number {
  let tokens = 0;
  for (const match of text.matchAll(/(\p{Script=Latin}+)|(\p{L}+)|(\p{N}+)|(\s+)|(.)/gsu)) {
    const [piece, latin, letters, digits, space] = match;
    if (latin !== undefined) {
      tokens +=
        Math.ceil(latin.length / 4) +
        Array.from(latin, (ch) => (ch > "\x7f" ? ch.length : 0)).reduce((a, b) => a + b, 0);
    } else if (letters !== undefined) tokens += letters.length + 1;
    else if (digits !== undefined) tokens += digits.length;
    else if (space !== undefined) tokens += space === " " ? 0 : Math.ceil(space.length / 2);
    else {
      const code = piece.codePointAt(0) ?? 0;
      tokens += code > 0xffff ? 3 : code > 0x7f ? 2 : 1;
    }
  }
  return tokens;
}

// Text where ASCII runs meet accented Latin, other scripts, other digits and spaces.
const MIXED = fc
  .array(
    fc.oneof(
      fc.string({ unit: "grapheme-ascii", maxLength: 12 }),
      fc.constantFrom("é", "ß", "д", "東", "٣", "Ⅻ", "\u00a0", "\u3000", "🎉", "\ud800", "ª", "—"),
      fc.string({ unit: "binary", maxLength: 4 }),
    ),
    { maxLength: 24 },
  )
  .map((parts) => parts.join(""));

describe("prompt token estimate", () => {
  it("counts every text as matching it piece by piece does", () => {
    fc.assert(
      fc.property(MIXED, (text) => estimateTextTokens(text) === piecewiseEstimate(text)),
      { numRuns: 2000 },
    );
    for (const text of SAMPLES) expect(estimateTextTokens(text)).toBe(piecewiseEstimate(text));
  });

  it("never counts fewer tokens than a GPT-like tokenizer for common kinds of text", () => {
    const short = SAMPLES.filter((text) => estimateTextTokens(text) < tokenize(text).length);
    expect(short).toEqual([]);
  });

  it("stays within three times a GPT-like count, so it refuses only prompts near the limit", () => {
    const far = SAMPLES.filter((text) => estimateTextTokens(text) > 3 * tokenize(text).length + 4);
    expect(far).toEqual([]);
  });

  it("counts nothing for empty text", () => {
    expect(estimateTextTokens("")).toBe(0);
  });

  it("adds per-message template overhead and tool definitions to chat prompts", () => {
    const one = ChatCompletionRequestSchema.parse({
      model: "m",
      messages: [{ role: "user", content: "hi" }],
    });
    const two = ChatCompletionRequestSchema.parse({
      model: "m",
      messages: [
        { role: "user", content: "hi" },
        { role: "user", content: "hi" },
      ],
    });
    const tools = ChatCompletionRequestSchema.parse({
      ...one,
      tools: [{ type: "function", function: { name: "lookup", description: "Looks things up." } }],
    });
    expect(estimateChatPromptTokens(two) - estimateChatPromptTokens(one)).toBeGreaterThan(
      estimateTextTokens("hi"),
    );
    expect(estimateChatPromptTokens(tools)).toBeGreaterThan(estimateChatPromptTokens(one) + 5);
  });

  it("counts an image part as a high-detail tile", () => {
    const body = ChatCompletionRequestSchema.parse({
      model: "m",
      messages: [
        { role: "user", content: [{ type: "image_url", image_url: { url: "https://x/y.png" } }] },
      ],
    });
    expect(estimateChatPromptTokens(body)).toBeGreaterThanOrEqual(765);
  });

  it("counts token-id prompts exactly and the longest of several prompts", () => {
    const ids = CompletionRequestSchema.parse({ model: "m", prompt: [5, 6, 7, 8] });
    const lists = CompletionRequestSchema.parse({
      model: "m",
      prompt: [
        [1, 2],
        [1, 2, 3, 4, 5],
      ],
    });
    const texts = CompletionRequestSchema.parse({
      model: "m",
      prompt: ["short", "a much longer prompt text"],
    });
    expect(estimateCompletionPromptTokens(ids)).toBe(4);
    expect(estimateCompletionPromptTokens(lists)).toBe(5);
    expect(estimateCompletionPromptTokens(texts)).toBe(
      1 + estimateTextTokens("a much longer prompt text"),
    );
  });
});
