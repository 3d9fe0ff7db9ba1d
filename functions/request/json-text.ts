/**
 * Surgical edits of JSON text. The edge forwards the client's body text, never a
 * re-serialisation (unknown fields, number spellings and key order stay as sent); the one
 * edit it needs is the `model` value when an alias resolves to a model id.
 * See docs/edge.md.
 */
/**
 * Replaces the value of every top-level `key` whose value is a string with `value`.
 * `text` must be a valid JSON object (the edge validated it before).
 */
export function replaceTopLevelString(text: string, key: string, value: string): string {
  const replacement = JSON.stringify(value);
  let out = "";
  let copiedTo = 0;
  let depth = 0;
  let expectKey = false;
  let pendingKey: string | undefined;
  let i = 0;
  while (i < text.length) {
    const ch = text.charCodeAt(i);
    if (ch === 0x22 /* " */) {
      const end = stringEnd(text, i);
      if (depth === 1 && expectKey) {
        pendingKey = decodeString(text.slice(i, end));
        expectKey = false;
      } else if (depth === 1 && pendingKey !== undefined) {
        if (pendingKey === key) {
          out += text.slice(copiedTo, i) + replacement;
          copiedTo = end;
        }
        pendingKey = undefined;
      }
      i = end;
      continue;
    }
    if (ch === 0x7b /* { */ || ch === 0x5b /* [ */) {
      depth++;
      if (depth === 1) expectKey = ch === 0x7b;
      else if (depth === 2) pendingKey = undefined;
    } else if (ch === 0x7d /* } */ || ch === 0x5d /* ] */) {
      depth--;
    } else if (ch === 0x2c /* , */ && depth === 1) {
      expectKey = true;
      pendingKey = undefined;
    } else if (depth === 1 && pendingKey !== undefined && ch > 0x20 && ch !== 0x3a /* : */) {
      // A number, true, false or null: not a string value, nothing to replace.
      pendingKey = undefined;
    }
    i++;
  }
  return copiedTo === 0 ? text : out + text.slice(copiedTo);
}

/**
 * Index just past the JSON string that starts at `start` (or the text's end). Found with
 * `indexOf` rather than character by character: a prompt is one long string.
 */
export function stringEnd(text: string, start: number): number {
  let from = start + 1;
  for (;;) {
    const quote = text.indexOf('"', from);
    if (quote === -1) return text.length;
    // A quote after an odd run of backslashes is escaped.
    let at = quote - 1;
    while (at > start && text.charCodeAt(at) === 0x5c /* \ */) at--;
    if ((quote - 1 - at) % 2 === 0) return quote + 1;
    from = quote + 1;
  }
}

function decodeString(literal: string): string {
  return literal.includes("\\") ? (JSON.parse(literal) as string) : literal.slice(1, -1);
}
