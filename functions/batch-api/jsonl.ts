/**
 * JSON Lines read from a byte stream (docs/batch-api.md, "Files"): each line's text with
 * where it lies in the file, so a batch can later read one line back by its byte range.
 */

/** One non-empty line: its 1-based number, byte offset and length (without its newline). */
export interface JsonlLine {
  number: number;
  offset: number;
  bytes: number;
  text: string;
}

const NEWLINE = 0x0a;
const CARRIAGE_RETURN = 0x0d;

/** The non-empty lines of a stream, in order; throws `TypeError` on bytes that are not UTF-8. */
export async function* jsonlLines(stream: ReadableStream<Uint8Array>): AsyncGenerator<JsonlLine> {
  const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });
  let pending = new Uint8Array(0);
  let pendingOffset = 0;
  let number = 0;
  const lineOf = (bytes: Uint8Array, offset: number): JsonlLine | null => {
    number += 1;
    let end = bytes.byteLength;
    if (end > 0 && bytes[end - 1] === CARRIAGE_RETURN) end -= 1;
    const text = decoder.decode(bytes.subarray(0, end));
    return text.trim() === "" ? null : { number, offset, bytes: end, text };
  };
  for await (const chunk of stream) {
    const joined = new Uint8Array(pending.byteLength + chunk.byteLength);
    joined.set(pending);
    joined.set(chunk, pending.byteLength);
    let start = 0;
    for (let i = joined.indexOf(NEWLINE); i !== -1; i = joined.indexOf(NEWLINE, start)) {
      const line = lineOf(joined.subarray(start, i), pendingOffset + start);
      if (line !== null) yield line;
      start = i + 1;
    }
    pending = joined.slice(start);
    pendingOffset += start;
  }
  const last = pending.byteLength > 0 ? lineOf(pending, pendingOffset) : null;
  if (last !== null) yield last;
}
