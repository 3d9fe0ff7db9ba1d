/**
 * A zod issue's path the way OpenAI names a `param` (`messages[0].content`), for request
 * bodies and the configuration alike. See docs/edge.md, "Errors".
 */

/** Formats a zod path the way OpenAI names params: `regions[0].origins[1].url`. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out;
}
