/**
 * Query-parameter checks shared by the read routes (usage, spend log, audit log): each
 * refuses a bad value with a 400 naming the parameter (docs/api.md, "Errors").
 */
import { invalidRequest } from "../../contracts/errors.ts";

/**
 * Refuses a query parameter the route does not take (400 `unsupported_parameter` naming
 * it), rather than answering as if it were not there.
 */
export function onlyParams(query: Record<string, string>, known: readonly string[]): void {
  const unknown = Object.keys(query).find((name) => !known.includes(name));
  if (unknown === undefined) return;
  throw invalidRequest(
    `Unsupported query parameter '${unknown.slice(0, 64)}': this route takes ${known.join(", ")}.`,
    unknown.slice(0, 64),
    "unsupported_parameter",
  );
}

/** `query[name]` when it is one of `values`, undefined when absent; 400 naming them else. */
export function oneOf<T extends string>(
  query: Record<string, string>,
  name: string,
  values: readonly T[],
): T | undefined {
  const value = values.find((one) => one === query[name]);
  if (query[name] !== undefined && value === undefined) {
    throw invalidRequest(`${name} must be one of ${values.join(", ")}.`, name, "invalid_value");
  }
  return value;
}

/** `value` as a whole number from `min` to `max`; 400 naming `param` else. */
export function whole(
  value: string,
  param: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < min || n > max) {
    throw invalidRequest(
      `${param} must be an integer from ${min} to ${max}.`,
      param,
      "invalid_value",
    );
  }
  return n;
}
