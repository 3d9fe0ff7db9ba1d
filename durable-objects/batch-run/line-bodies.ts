/**
 * Lines' bodies from the batch's input file (docs/batch-api.md, "Lines"): lines sent
 * together are read in as few range reads as their places in the file allow, each range at
 * most `READ_SPAN_BYTES` and skipping at most `READ_GAP_BYTES` between two lines.
 */
import type { LineToRun } from "./types.ts";

/** Two lines at most this far apart in the file are read in one range. */
export const READ_GAP_BYTES = 64 * 1024;
/** The most one range read spans. */
export const READ_SPAN_BYTES = 1024 * 1024;

/** One range of the file and the lines in it. */
export interface ReadSpan {
  offset: number;
  length: number;
  lines: LineToRun[];
}

/** The ranges that cover `lines` (pure). */
export function readSpans(
  lines: readonly LineToRun[],
  gap = READ_GAP_BYTES,
  most = READ_SPAN_BYTES,
): ReadSpan[] {
  const spans: ReadSpan[] = [];
  let last: ReadSpan | null = null;
  for (const line of [...lines].sort((a, b) => a.offset - b.offset)) {
    const end = line.offset + line.bytes;
    if (
      last !== null &&
      line.offset - (last.offset + last.length) <= gap &&
      end - last.offset <= most
    ) {
      last.length = Math.max(last.length, end - last.offset);
      last.lines.push(line);
    } else {
      last = { offset: line.offset, length: line.bytes, lines: [line] };
      spans.push(last);
    }
  }
  return spans;
}

/** What a line's read gave: its request body, or why there is none. */
export type LineBody = Record<string, unknown> | Error;

/** What a read needs of the files' bucket (an R2 bucket's `get` with a range). */
export interface RangeReader {
  get(
    key: string,
    options: { range: { offset: number; length: number } },
  ): Promise<{ arrayBuffer(): Promise<ArrayBuffer> } | null>;
}

const decoder = new TextDecoder();

/** Each line's `body` from the input file `key` in `bucket`. */
export async function readBodies(
  bucket: RangeReader,
  key: string,
  lines: readonly LineToRun[],
): Promise<Map<number, LineBody>> {
  const bodies = new Map<number, LineBody>();
  const read = async (span: ReadSpan) => {
    const object = await bucket.get(key, { range: { offset: span.offset, length: span.length } });
    if (object === null) throw new Error("input file gone");
    const bytes = new Uint8Array(await object.arrayBuffer());
    for (const line of span.lines) {
      const at = line.offset - span.offset;
      try {
        const text = decoder.decode(bytes.subarray(at, at + line.bytes));
        bodies.set(line.idx, (JSON.parse(text) as { body: Record<string, unknown> }).body);
      } catch (error) {
        bodies.set(line.idx, error as Error);
      }
    }
  };
  await Promise.all(
    readSpans(lines).map((span) =>
      read(span).catch((error: unknown) => {
        for (const line of span.lines) bodies.set(line.idx, error as Error);
      }),
    ),
  );
  return bodies;
}
