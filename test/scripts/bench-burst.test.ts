import { describe, expect, it } from "vitest";
import type { BreakerView } from "../../contracts/breaker.ts";
import { openingsOf } from "../../bench/burst-breakers.ts";
import { SseReader, poisonBody, servedWhole, tally } from "../../bench/burst-client.ts";

const token = (content: string) =>
  `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content } }] })}\n\n`;

function read(...chunks: string[]) {
  const reader = new SseReader();
  for (const chunk of chunks) reader.feed(chunk);
  return reader.verdict;
}

describe("the burst bench's stream verdict", () => {
  it("calls a stream that ends with [DONE] and no error event served whole", () => {
    const verdict = read(token("Hi"), token(" there"), "data: [DONE]\n\n");
    expect(verdict.tokens).toBe(2);
    expect(servedWhole(verdict)).toBe(true);
  });

  it("reads events split across chunks and CRLF framing", () => {
    const text = token("a").replaceAll("\n", "\r\n") + "data: [DO";
    const verdict = read(text.slice(0, 7), text.slice(7), "NE]\r\n\r\n");
    expect(verdict).toMatchObject({ tokens: 1, done: true });
  });

  it("calls a stream cut by an error event not whole, with the error's code", () => {
    const error = `data: ${JSON.stringify({ error: { code: "origin_error" } })}\n\n`;
    const verdict = read(token("a"), error);
    expect(servedWhole(verdict)).toBe(false);
    expect(verdict.errorCode).toBe("origin_error");
  });

  it("calls a stream that ended without [DONE] not whole", () => {
    expect(servedWhole(read(token("a"), token("b")))).toBe(false);
  });
});

describe("the burst bench's poison request", () => {
  it("is valid JSON whose schema is nested as deep as asked", () => {
    const body = JSON.parse(poisonBody(1_000)) as {
      response_format: { json_schema: { schema: Record<string, unknown> } };
    };
    let depth = 0;
    let node: Record<string, unknown> | undefined = body.response_format.json_schema.schema;
    while (node?.type === "object") {
      depth += 1;
      node = (node.properties as { a: Record<string, unknown> }).a;
    }
    expect(depth).toBe(1_000);
  });
});

describe("the burst bench's tally", () => {
  it("counts refusals with and without retry-after and no_healthy_origin answers", () => {
    const base = { ttftMs: null, totalMs: 1, tokens: 0, origin: null, attempts: 0, sentAt: 0 };
    const t = tally([
      { ...base, kind: "refused", status: 503, code: "no_healthy_origin", retryAfter: true },
      { ...base, kind: "refused", status: 502, code: "origin_error", retryAfter: false },
      { ...base, kind: "cut", status: 200, code: "origin_error", retryAfter: false, tokens: 3 },
      { ...base, kind: "whole", status: 200, code: null, retryAfter: false, ttftMs: 10 },
    ]);
    expect(t).toMatchObject({
      sent: 4,
      whole: 1,
      refused: 2,
      refusedWithRetryAfter: 1,
      cut: 1,
      cutAfterTokens: 1,
      noHealthyOrigin: 1,
      ttftP50: 10,
    });
  });
});

const view = (origin: string, state: BreakerView["state"], opened: number): BreakerView => ({
  region: "eu",
  origin,
  state,
  since: 0,
  failures: 0,
  requests: 0,
  opened_count: opened,
  retry_at: null,
  forced: false,
});

describe("the burst bench's breaker openings", () => {
  it("counts an opening seen only while polling, after the breaker closed again", () => {
    const before = [view("eu-1", "closed", 0), view("eu-2", "closed", 0)];
    const after = [view("eu-1", "closed", 0), view("eu-2", "closed", 0)];
    const seen = [
      { at: 1, origin: "eu-1", from: "closed", to: "open" },
      { at: 2, origin: "eu-1", from: "open", to: "half_open" },
    ];
    expect(openingsOf(before, after, seen)).toMatchObject({ opened: ["eu-1"], total: 1 });
  });

  it("counts openings from opened_count when polling missed them", () => {
    const before = [view("eu-1", "closed", 1)];
    const after = [view("eu-1", "closed", 3)];
    expect(openingsOf(before, after, [])).toMatchObject({ opened: ["eu-1"], total: 2 });
  });
});
