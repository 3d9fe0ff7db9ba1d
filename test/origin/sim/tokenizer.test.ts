import { describe, expect, it } from "vitest";
import { IMAGE_TOKENS, renderChatPrompt } from "../../../origin/sim/chat-template.ts";
import { countTokens, tokenize, tokenizeWithText } from "../../../origin/sim/tokenizer.ts";

const SAMPLES = {
  english: "The quick brown fox jumps over the lazy dog. It's 2026, and 1234567 tokens flew by!",
  japanese: "東京の天気は晴れです。明日も良い天気でしょう。カタカナとひらがな。",
  chinese: "今天天气很好，我们去公园散步吧。",
  korean: "안녕하세요, 반갑습니다.",
  emoji: "Launch 🚀 done 👍🏽 — café naïve Привет",
};

describe("tokenizer", () => {
  it("gives the same ids and counts for the same text every time", () => {
    for (const text of Object.values(SAMPLES)) {
      expect(tokenize(text)).toEqual(tokenize(text));
      expect(countTokens(text)).toBe(tokenize(text).length);
    }
  });

  it("counts stable values for English, Japanese, Chinese, Korean and emoji", () => {
    expect(
      Object.fromEntries(Object.entries(SAMPLES).map(([k, v]) => [k, countTokens(v)])),
    ).toEqual({ english: 29, japanese: 33, chinese: 16, korean: 13, emoji: 26 });
  });

  it("splits Latin words every four letters and keeps the leading space", () => {
    expect(tokenizeWithText(" hello world").map((t) => t.text)).toEqual([
      " hell",
      "o",
      " worl",
      "d",
    ]);
  });

  it("groups numbers in runs of at most three digits", () => {
    expect(tokenizeWithText("1234567").map((t) => t.text)).toEqual(["123", "456", "7"]);
  });

  it("counts each CJK, kana and hangul character as one token", () => {
    expect(countTokens("日本語")).toBe(3);
    expect(countTokens("ひらがな")).toBe(4);
    expect(countTokens("한국어")).toBe(3);
  });

  it("counts other non-ASCII text as one token per two UTF-8 bytes", () => {
    expect(countTokens("😀")).toBe(2); // 4 bytes
    expect(countTokens("é")).toBe(1); // 2 bytes
    expect(countTokens("ไทย")).toBe(5); // 9 bytes
  });

  it("keeps the text of every token, so the tokens rebuild the input", () => {
    for (const text of Object.values(SAMPLES)) {
      expect(
        tokenizeWithText(text)
          .map((t) => t.text)
          .join(""),
      ).toBe(text);
    }
  });

  it("never gives fewer tokens to a longer prefix of the same text", () => {
    for (const text of Object.values(SAMPLES)) {
      const chars: string[] = [];
      for (const char of text) chars.push(char);
      let previous = 0;
      for (let i = 1; i <= chars.length; i++) {
        const count = countTokens(chars.slice(0, i).join(""));
        expect(count).toBeGreaterThanOrEqual(previous);
        previous = count;
      }
    }
  });
});

function imagePrompt(url: string): number[] {
  return renderChatPrompt([{ role: "user", content: [{ type: "image_url", url }] }]);
}

describe("chat template", () => {
  const user = { role: "user" as const, content: "What is the weather in Paris?" };

  it("counts a system prompt, tool definitions and images in the prompt", () => {
    const base = renderChatPrompt([user]).length;
    const withSystem = renderChatPrompt([{ role: "system", content: "Be brief." }, user]).length;
    const withTools = renderChatPrompt(
      [user],
      [
        {
          name: "get_weather",
          parameters: { type: "object", properties: { city: { type: "string" } } },
        },
      ],
    ).length;
    const withImage = renderChatPrompt([
      {
        role: "user",
        content: [
          { type: "text", text: "What is the weather in Paris?" },
          { type: "image_url", url: "https://example.com/sky.png" },
        ],
      },
    ]).length;
    expect(withSystem).not.toBe(base);
    expect(withTools).toBeGreaterThan(base + 50);
    expect(withImage).toBe(base + IMAGE_TOKENS + 2);
  });

  it("renders assistant tool calls and tool results into the prompt", () => {
    const turn = [
      user,
      {
        role: "assistant" as const,
        content: null,
        toolCalls: [{ id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' }],
      },
      { role: "tool" as const, content: '{"temp":21}', toolCallId: "call_1" },
    ];
    const tokens = renderChatPrompt(turn);
    expect(tokens.length).toBeGreaterThan(renderChatPrompt([user]).length + 20);
    // Earlier turns are a prefix of the longer conversation, which is what prefix caching needs.
    const first = renderChatPrompt([user]);
    expect(tokens.slice(0, first.length - 3)).toEqual(first.slice(0, -3));
  });

  it("gives different images different tokens", () => {
    expect(imagePrompt("https://a.example/1.png")).not.toEqual(
      imagePrompt("https://a.example/2.png"),
    );
  });
});
