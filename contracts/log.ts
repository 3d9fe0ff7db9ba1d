/**
 * Structured logs: one JSON object per line (`level`, `msg` and named fields such as
 * `request_id`, `key_id`, `origin`), what Workers Logs and `wrangler tail` index. Fields
 * never hold an API key, a token or a prompt: callers pass ids and short details only.
 * See docs/metrics.md, "Logs".
 */

/** A log field's value: a string, a number, a boolean, or null. */
export type LogValue = string | number | boolean | null | undefined;

function describe(value: unknown): LogValue {
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  if (value === null || value === undefined) return value;
  if (typeof value === "string" || typeof value === "number" || typeof value === "boolean") {
    return value;
  }
  try {
    return JSON.stringify(value);
  } catch {
    return Object.prototype.toString.call(value);
  }
}

function line(level: string, msg: string, fields: Record<string, unknown>): string {
  const out: Record<string, LogValue> = { level, msg };
  for (const [name, value] of Object.entries(fields)) {
    const v = describe(value);
    if (v !== undefined) out[name] = v;
  }
  return JSON.stringify(out);
}

/** Something went wrong that a person should look at. */
export function logError(msg: string, fields: Record<string, unknown> = {}): void {
  console.error(line("error", msg, fields));
}

/** Something unusual that the gateway handled. */
export function logWarn(msg: string, fields: Record<string, unknown> = {}): void {
  console.warn(line("warn", msg, fields));
}
