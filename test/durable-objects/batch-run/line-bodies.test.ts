import * as fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  InputFileGone,
  LineUnreadable,
  type RangeReader,
  readBodies,
  readSpans,
  unreadOutcome,
} from "../../../durable-objects/batch-run/line-bodies.ts";
import { chargeDue, linesToStart } from "../../../durable-objects/batch-run/lifecycle.ts";
import type { LineToRun } from "../../../durable-objects/batch-run/types.ts";

const line = (idx: number, offset: number, bytes: number): LineToRun => ({
  idx,
  customId: `c${idx}`,
  prefix: null,
  offset,
  bytes,
  promptTokens: 1,
  maxTokens: 1,
});

describe("reading lines sent together", () => {
  it("reads lines close together in one range, in file order, whatever order they came in", () => {
    const spans = readSpans([line(2, 500, 100), line(0, 0, 100), line(1, 150, 100)], 250, 10_000);
    expect(spans).toEqual([
      { offset: 0, length: 600, lines: [line(0, 0, 100), line(1, 150, 100), line(2, 500, 100)] },
    ]);
  });

  it("starts a new range past the gap or the longest span", () => {
    const far = readSpans([line(0, 0, 100), line(1, 301, 100)], 200, 10_000);
    expect(far.map((span) => [span.offset, span.length])).toEqual([
      [0, 100],
      [301, 100],
    ]);
    const long = readSpans([line(0, 0, 100), line(1, 100, 100), line(2, 200, 100)], 50, 250);
    expect(long.map((span) => [span.offset, span.length, span.lines.length])).toEqual([
      [0, 200, 2],
      [200, 100, 1],
    ]);
  });

  it("covers every line's bytes exactly once", () => {
    // Lines one after another in a file (each `gap` bytes after the one before), some sent.
    // Mostly close together (ranges that reach their longest), now and then far apart.
    const spacing = fc.oneof(
      { arbitrary: fc.nat(16), weight: 4 },
      { arbitrary: fc.nat(8000), weight: 1 },
    );
    const file = fc.array(
      fc.record({ bytes: fc.integer({ min: 1, max: 3000 }), gap: spacing, sent: fc.boolean() }),
      { maxLength: 500, size: "max" },
    );
    fc.assert(
      fc.property(file, (parts) => {
        let offset = 0;
        const lines: LineToRun[] = [];
        for (const [idx, { bytes, gap, sent }] of parts.entries()) {
          offset += gap;
          if (sent) lines.push(line(idx, offset, bytes));
          offset += bytes;
        }
        const spans = readSpans(lines, 4096, 65_536);
        expect(spans.flatMap((span) => span.lines.map((l) => l.idx)).sort((a, b) => a - b)).toEqual(
          lines.map((l) => l.idx),
        );
        for (const span of spans) {
          expect(span.length).toBeLessThanOrEqual(65_536);
          for (const l of span.lines) {
            expect(l.offset).toBeGreaterThanOrEqual(span.offset);
            expect(l.offset + l.bytes).toBeLessThanOrEqual(span.offset + span.length);
          }
        }
      }),
      { numRuns: 300, seed: 3 },
    );
  });
});

describe("reading lines' bodies", () => {
  const file = [
    '{"body":{"n":0}}',
    "not json",
    '{"body":{"n":2}}',
    '{"body":{"é":3}}',
    '{"body":[1]}',
  ];
  const bytes = new TextEncoder().encode(file.join("\n"));
  const lines: LineToRun[] = [];
  let at = 0;
  for (const [idx, text] of file.entries()) {
    const length = new TextEncoder().encode(text).length;
    lines.push(line(idx, at, length));
    at += length + 1;
  }
  const reads: [number, number][] = [];
  const bucket: RangeReader = {
    get: async (_key, { range }) => {
      reads.push([range.offset, range.length]);
      const part = bytes.slice(range.offset, range.offset + range.length);
      return { arrayBuffer: async () => part.buffer };
    },
  };

  it("reads a group in one range and parses each line, a bad line alone failing", async () => {
    const bodies = await readBodies(
      bucket,
      "k",
      [lines[3], lines[0], lines[4], lines[1], lines[2]].filter((l) => l !== undefined),
    );
    expect(reads).toEqual([[0, bytes.length]]);
    expect(bodies.get(0)).toEqual({ n: 0 });
    expect(bodies.get(1)).toBeInstanceOf(LineUnreadable);
    expect(bodies.get(2)).toEqual({ n: 2 });
    expect(bodies.get(3)).toEqual({ é: 3 });
    expect(bodies.get(4)).toBeInstanceOf(LineUnreadable);
  });

  it("fails each line of a range whose file is gone", async () => {
    const gone: RangeReader = { get: async () => null };
    const bodies = await readBodies(gone, "k", lines);
    expect([...bodies.values()].every((body) => body instanceof InputFileGone)).toBe(true);
    expect(bodies.size).toBe(lines.length);
  });
});

describe("a line that could not be read", () => {
  it("fails for good when the file is gone or the line is no request, else goes again", () => {
    expect(unreadOutcome(new InputFileGone(), 2000)).toMatchObject({
      kind: "failed",
      code: "input_file_deleted",
    });
    expect(unreadOutcome(new LineUnreadable(), 2000)).toMatchObject({
      kind: "failed",
      code: "invalid_line",
    });
    expect(unreadOutcome(new Error("network"), 2000)).toEqual({ kind: "retry", afterMs: 2000 });
    expect(unreadOutcome(undefined, 2000)).toEqual({ kind: "retry", afterMs: 2000 });
  });
});

describe("when lines start", () => {
  it("starts them in groups of an eighth of the lane", () => {
    expect(linesToStart(128, 15, 1000)).toBe(0);
    expect(linesToStart(128, 16, 1000)).toBe(16);
    expect(linesToStart(128, 40, 1000)).toBe(40);
  });

  it("starts what is left, and anything when none runs", () => {
    expect(linesToStart(128, 5, 3)).toBe(3);
    expect(linesToStart(128, 10, 0)).toBe(0);
    expect(linesToStart(4, 4, 1000)).toBe(4);
    expect(linesToStart(1, 1, 5)).toBe(1);
  });
});

describe("when ended lines are billed", () => {
  it("bills at 64 ended lines, or a second after the last charge, never with none", () => {
    expect(chargeDue(64, 0)).toBe(true);
    expect(chargeDue(63, 999)).toBe(false);
    expect(chargeDue(1, 1_000)).toBe(true);
    expect(chargeDue(0, 60_000)).toBe(false);
  });
});
