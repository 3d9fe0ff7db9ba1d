import { describe, expect, it } from "vitest";
import {
  BLOCK_TOKENS,
  BYTES_PER_TOKEN,
  blockHashes,
  blockTokens,
  promptBlocks,
  renderPrompt,
} from "../../contracts/prefix-blocks.ts";

const BLOCK = BYTES_PER_TOKEN * BLOCK_TOKENS;
const system = "You are a careful assistant for the billing team. ".repeat(40);
const ask = (question: string) => ({
  messages: [
    { role: "system", content: system },
    { role: "user", content: question.repeat(6) },
  ],
});

describe("prefix blocks", () => {
  it("share exactly the blocks whose text two prompts share", () => {
    const a = renderPrompt(ask("What is due today? "));
    const b = renderPrompt(ask("Refund my order now. "));
    const ha = blockHashes("m", a);
    const hb = blockHashes("m", b);
    let common = 0;
    while (a[common] === b[common]) common++;
    const shared = Math.floor(common / BLOCK);
    expect(shared).toBeGreaterThan(10);
    expect(ha.length).toBeGreaterThan(shared);
    expect(ha.slice(0, shared)).toEqual(hb.slice(0, shared));
    expect(ha[shared]).not.toBe(hb[shared]);
  });

  it("hash a request piece by piece exactly as its whole rendering, any script", () => {
    const request = {
      messages: [
        { role: "system", content: "Réponds en français, s'il te plaît. ".repeat(9) },
        {
          role: "user",
          content: [
            { type: "text", text: "日本語でも大丈夫？ ".repeat(11) },
            { type: "image_url" },
          ],
        },
        { role: "assistant", content: "Bien sûr 🙂 ".repeat(13) },
      ],
    };
    const blocks = promptBlocks("m", request);
    expect(blocks.length).toBeGreaterThan(5);
    expect(blocks).toEqual(blockHashes("m", renderPrompt(request)));
    expect(promptBlocks("m", request, 3)).toEqual(blocks.slice(0, 3));
  });

  it("differ for another model, and leave a trailing partial block unhashed", () => {
    const text = "x".repeat(BLOCK * 3 + 5);
    expect(blockHashes("m", text)).toHaveLength(3);
    expect(blockHashes("n", text)[0]).not.toBe(blockHashes("m", text)[0]);
    expect(blockTokens(3)).toBe(3 * BLOCK_TOKENS);
  });

  it("render chat roles and text parts, and a completion's first prompt", () => {
    expect(
      renderPrompt({
        messages: [
          { role: "user", content: [{ type: "text", text: "Hi" }, { type: "image_url" }] },
        ],
      }),
    ).toBe("<|user|>\nHi<image_url>\n");
    expect(renderPrompt({ prompt: ["first", "second"] })).toBe("first");
    expect(renderPrompt({ prompt: [[1, 2, 3]] })).toBe("1,2,3");
    expect(renderPrompt({ prompt: [4, 5] })).toBe("4,5");
  });
});
