/**
 * Turns a zod issue into OpenAI's 400: the same messages, `param` paths
 * (`messages[0].content[1].type`) and codes (`missing_required_parameter`, `invalid_type`,
 * `invalid_value`, `empty_array`, `integer_below_min_value`, …) that OpenAI's API returns.
 * See docs/edge.md.
 */
import type { z } from "zod";
import { formatPath } from "../../contracts/param-path.ts";
import { type ApiError, clipped, invalidRequest, isErrorCode } from "../../contracts/errors.ts";

type Issue = z.core.$ZodIssue;

/**
 * Parse options for bodies that {@link validationError} reports: the input kept, and only
 * the first issue made, as only it is reported (zod's `abortEarly`, which its `validate`
 * uses): a body of a million bad values costs one issue, not a million.
 */
export const FIRST_ISSUE: z.core.ParseContextInternal<Issue> = {
  reportInput: true,
  abortEarly: true,
};

// Params typed as integers (OpenAI's, then the gateway's own: keys' limits, browser tokens),
// so their range errors say "integer", not "decimal".
const INTEGER_PARAMS = new Set([
  "rpm",
  "tpm",
  "concurrency",
  "ttl_seconds",
  "grace_seconds",
  "n",
  "max_tokens",
  "max_completion_tokens",
  "seed",
  "top_logprobs",
  "logprobs",
  "best_of",
  "max_output_tokens",
  "max_tool_calls",
  "dimensions",
]);

/** The OpenAI 400 for the first of `issues`. */
export function validationError(issues: readonly Issue[]): ApiError {
  const issue = issues[0];
  if (issue === undefined) return invalidRequest("Invalid request body.", null, null);
  return describeIssue(issue, []);
}

function hasInput(issue: Issue): boolean {
  return "input" in issue && issue.input !== undefined;
}

function describeIssue(issue: Issue, prefix: readonly PropertyKey[]): ApiError {
  const path = [...prefix, ...issue.path];
  // Record keys are the client's: a path quotes at most so much of them.
  const param = clipped(formatPath(path));
  switch (issue.code) {
    case "invalid_type":
      if (path.length === 0) {
        return invalidRequest(
          `Invalid request body: expected a JSON object, but got ${describeValue(issue.input)} instead.`,
          null,
          "invalid_type",
        );
      }
      if (!hasInput(issue)) {
        return invalidRequest(
          `Missing required parameter: '${param}'.`,
          param,
          "missing_required_parameter",
        );
      }
      return invalidRequest(
        `Invalid type for '${param}': expected ${article(issue.expected)}, but got ${describeValue(issue.input)} instead.`,
        param,
        "invalid_type",
      );
    case "invalid_value":
      return invalidRequest(
        `Invalid value: ${quote(issue.input)}. Supported values are: ${listValues(issue.values)}.`,
        param,
        "invalid_value",
      );
    case "invalid_union":
      return describeUnion(issue, path);
    case "unrecognized_keys": {
      // As OpenAI words an argument it does not know: named in the message, no param.
      const where = path.length === 0 ? "" : ` in '${param}'`;
      const keys = issue.keys.map((key) => clipped(key)).join(", ");
      return invalidRequest(`Unrecognized request argument supplied${where}: ${keys}`, null, null);
    }
    case "too_small":
      return describeRange(issue, path, "min");
    case "too_big":
      return describeRange(issue, path, "max");
    case "invalid_format":
      return invalidRequest(
        `Invalid '${param}': ${sentence(issue.message)}`,
        param,
        "invalid_value",
      );
    case "custom": {
      const params = issue.params as { openai?: string; verbatim?: boolean } | undefined;
      const message = params?.verbatim
        ? issue.message
        : `Invalid value for '${param}': ${sentence(issue.message)}`;
      const code = params?.openai;
      return invalidRequest(
        message,
        param,
        code !== undefined && isErrorCode(code) ? code : "invalid_value",
      );
    }
    default:
      return invalidRequest(
        `Invalid '${param}': ${sentence(issue.message)}`,
        param,
        "invalid_value",
      );
  }
}

/** A message ending in one full stop, whether it came with one or not. */
function sentence(message: string): string {
  return message.endsWith(".") ? message : `${message}.`;
}

function describeUnion(
  issue: Extract<Issue, { code: "invalid_union" }>,
  path: readonly PropertyKey[],
): ApiError {
  const param = formatPath(path);
  if ("discriminator" in issue && typeof issue.discriminator === "string") {
    // zod reports an unknown discriminator at the discriminator's own path already.
    const input = issue.input as Record<string, unknown> | undefined;
    const value = input?.[issue.discriminator];
    if (value === undefined) {
      return invalidRequest(
        `Missing required parameter: '${param}'.`,
        param,
        "missing_required_parameter",
      );
    }
    const options = "options" in issue && Array.isArray(issue.options) ? issue.options : [];
    return invalidRequest(
      `Invalid value: ${quote(value)}. Supported values are: ${listValues(options)}.`,
      param,
      "invalid_value",
    );
  }
  if (!hasInput(issue)) {
    return invalidRequest(
      `Missing required parameter: '${param}'.`,
      param,
      "missing_required_parameter",
    );
  }
  // Report the branch that got furthest: one that failed below the union's own value, or on
  // something other than its type, is the one the caller meant. An object or array refused
  // by a branch of names (`tool_choice: "auto"`) failed on its type too.
  const container = typeof issue.input === "object" && issue.input !== null;
  for (const branch of issue.errors) {
    const first = branch[0];
    if (first === undefined) continue;
    const wrongType =
      first.code === "invalid_type" || (first.code === "invalid_value" && container);
    if (first.path.length > 0 || !wrongType) return describeIssue(first, path);
  }
  const expected = issue.errors.flatMap((branch) => {
    const first = branch[0];
    return first?.code === "invalid_type" ? [article(first.expected)] : [];
  });
  const unique = [...new Set(expected)];
  const what = unique.length === 1 ? unique[0] : `one of ${unique.join(" or ")}`;
  return invalidRequest(
    `Invalid type for '${param}': expected ${what}, but got ${describeValue(issue.input)} instead.`,
    param,
    "invalid_type",
  );
}

function describeRange(
  issue: Extract<Issue, { code: "too_small" | "too_big" }>,
  path: readonly PropertyKey[],
  side: "min" | "max",
): ApiError {
  const param = formatPath(path);
  const bound =
    side === "min"
      ? (issue as { minimum: unknown }).minimum
      : (issue as { maximum: unknown }).maximum;
  const input = issue.input;
  switch (issue.origin) {
    case "array": {
      const length = Array.isArray(input) ? input.length : 0;
      if (side === "min" && length === 0) {
        return invalidRequest(
          `Invalid '${param}': empty array. Expected an array with minimum length ${String(bound)}, but got an empty array instead.`,
          param,
          "empty_array",
        );
      }
      const adjective = side === "min" ? "too short" : "too long";
      return invalidRequest(
        `Invalid '${param}': array ${adjective}. Expected an array with ${side === "min" ? "minimum" : "maximum"} length ${String(bound)}, but got an array with length ${length} instead.`,
        param,
        side === "min" ? "array_below_min_length" : "array_above_max_length",
      );
    }
    case "object": {
      const size = typeof input === "object" && input !== null ? Object.keys(input).length : 0;
      return invalidRequest(
        `Invalid '${param}': too many properties. Expected an object with at most ${String(bound)} properties, but got an object with ${size} properties instead.`,
        param,
        "object_above_max_size",
      );
    }
    case "string": {
      const length = typeof input === "string" ? input.length : 0;
      return invalidRequest(
        `Invalid '${param}': string too ${side === "min" ? "short" : "long"}. Expected a string with ${side === "min" ? "minimum" : "maximum"} length ${String(bound)}, but got a string with length ${length} instead.`,
        param,
        side === "min" ? "string_too_short" : "string_above_max_length",
      );
    }
    default: {
      const last = path.at(-1);
      const kind = typeof last === "string" && INTEGER_PARAMS.has(last) ? "integer" : "decimal";
      const direction = side === "min" ? "below minimum" : "above maximum";
      const sign = side === "min" ? ">=" : "<=";
      return invalidRequest(
        `Invalid '${param}': ${kind} ${direction} value. Expected a value ${sign} ${String(bound)}, but got ${String(input)} instead.`,
        param,
        `${kind}_${side === "min" ? "below_min" : "above_max"}_value`,
      );
    }
  }
}

function article(expected: string): string {
  switch (expected) {
    case "int":
      return "an integer";
    case "array":
      return "an array";
    case "object":
      return "an object";
    case "string":
      return "a string";
    case "number":
      return "a number";
    case "boolean":
      return "a boolean";
    default:
      return expected;
  }
}

function describeValue(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  switch (typeof value) {
    case "string":
      return "a string";
    case "number":
      return Number.isInteger(value) ? "an integer" : "a decimal";
    case "boolean":
      return "a boolean";
    case "object":
      return "an object";
    default:
      return typeof value;
  }
}

function quote(value: unknown): string {
  return typeof value === "string"
    ? `'${clipped(value)}'`
    : clipped(JSON.stringify(value) ?? String(value));
}

// OpenAI lists options as 'a', 'b', and 'c'.
function listValues(values: readonly unknown[]): string {
  const quoted = values.map((value) => quote(value));
  if (quoted.length <= 1) return quoted.join("");
  if (quoted.length === 2) return `${quoted[0]} and ${quoted[1]}`;
  return `${quoted.slice(0, -1).join(", ")}, and ${quoted.at(-1)}`;
}
