/**
 * Lines' bodies from the batch's input file (docs/batch-api.md, "Lines"): lines sent
 * together are read in as few range reads as their places in the file allow, each range at
 * most `READ_SPAN_BYTES` and skipping at most `READ_GAP_BYTES` between two lines.
 */
import type { LineOutcome } from "./line-outcome.ts";
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

/** The input file is gone (deleted while the batch ran): none of its lines can be read. */
export class InputFileGone extends Error {}
/** A line's bytes are not a JSON object with a `body` object: they never will be. */
export class LineUnreadable extends Error {}

/** What a line's read gave: its request body, or why there is none. */
export type LineBody = Record<string, unknown> | Error;

/**
 * How a line whose body could not be read ends: failed for good when the file is gone or
 * the line is not a request, else (a read that failed on the way) sent again after `retryMs`.
 */
export function unreadOutcome(error: Error | undefined, retryMs: number): LineOutcome {
  if (error instanceof InputFileGone) {
    return {
      kind: "failed",
      code: "input_file_deleted",
      message: "The batch's input file was deleted before this line ran.",
    };
  }
  if (error instanceof LineUnreadable) {
    return {
      kind: "failed",
      code: "invalid_line",
      message: "This line of the input file could not be read as a request.",
    };
  }
  return { kind: "retry", afterMs: retryMs };
}

/** What a read needs of the files' bucket (an R2 bucket's `get` with a range). */
export interface RangeReader {
  get(
    key: string,
    options: { range: { offset: number; length: number } },
  ): Promise<{ arrayBuffer(): Promise<ArrayBuffer> } | null>;
}

const decoder = new TextDecoder();

function bodyOf(text: string): LineBody {
  try {
    const { body } = JSON.parse(text) as { body?: unknown };
    if (typeof body === "object" && body !== null && !Array.isArray(body)) {
      return body as Record<string, unknown>;
    }
  } catch {
    // Not JSON: as unreadable as JSON without a body.
  }
  return new LineUnreadable("not a request line");
}

/** Each line's `body` from the input file `key` in `bucket`. */
export async function readBodies(
  bucket: RangeReader,
  key: string,
  lines: readonly LineToRun[],
): Promise<Map<number, LineBody>> {
  const bodies = new Map<number, LineBody>();
  const read = async (span: ReadSpan) => {
    const object = await bucket.get(key, { range: { offset: span.offset, length: span.length } });
    if (object === null) throw new InputFileGone("input file gone");
    const bytes = new Uint8Array(await object.arrayBuffer());
    for (const line of span.lines) {
      const at = line.offset - span.offset;
      bodies.set(line.idx, bodyOf(decoder.decode(bytes.subarray(at, at + line.bytes))));
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
