import { describe, expect, it } from "vitest";
import { replaceTopLevelString, stringEnd } from "../../../functions/request/json-text.ts";

describe("replaceTopLevelString", () => {
  it("replaces the top-level value and leaves every other byte as sent", () => {
    const text = '{ "model" : "fast",\n"x":1.50, "top_k": 40 }';
    expect(replaceTopLevelString(text, "model", "m-8b")).toBe(
      '{ "model" : "m-8b",\n"x":1.50, "top_k": 40 }',
    );
  });

  it("ignores the same key inside nested objects and strings", () => {
    const text =
      '{"messages":[{"model":"fast","content":"\\"model\\":\\"fast\\""}],"model":"fast"}';
    const out = replaceTopLevelString(text, "model", "m");
    expect(JSON.parse(out)).toEqual({
      messages: [{ model: "fast", content: '"model":"fast"' }],
      model: "m",
    });
  });

  it("matches a key written with escapes, as JSON.parse reads it", () => {
    const out = replaceTopLevelString('{"mod\\u0065l":"fast"}', "model", "m");
    expect(JSON.parse(out)).toEqual({ model: "m" });
  });

  it("replaces every duplicate, so the value JSON.parse keeps is the new one", () => {
    const out = replaceTopLevelString('{"model":"a","n":1,"model":"b"}', "model", "m");
    expect(out).toBe('{"model":"m","n":1,"model":"m"}');
  });

  it("escapes the new value", () => {
    const out = replaceTopLevelString('{"model":"a"}', "model", 'q"uote');
    expect(JSON.parse(out)).toEqual({ model: 'q"uote' });
  });

  it("leaves text without the key untouched", () => {
    const text = '{"a":{"model":"x"}}';
    expect(replaceTopLevelString(text, "model", "m")).toBe(text);
  });
});

describe("stringEnd", () => {
  it("ends a string at its first quote that no odd run of backslashes escapes", () => {
    for (const value of ["", "plain", 'say "hi"', "a\\", 'a\\"b', '\\\\"', "x".repeat(5000)]) {
      const text = `${JSON.stringify(value)}, "next"`;
      expect(stringEnd(text, 0)).toBe(JSON.stringify(value).length);
    }
  });

  it("runs to the end of text whose string never closes", () => {
    const text = '"open \\" still';
    expect(stringEnd(text, 0)).toBe(text.length);
  });
});
