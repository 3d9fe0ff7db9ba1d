/**
 * What one request may ask at the edge, so that no single body can hold an origin or the
 * edge itself: list sizes (enforced by the request schemas) and how deep free-form JSON
 * nests, measured on the body text before it is parsed, in one pass without recursion.
 * See docs/edge.md, "Request bounds".
 */
import type { z } from "zod";
import { formatPath } from "../../contracts/param-path.ts";
import { type ApiError, clipped, invalidRequest } from "../../contracts/errors.ts";
import { stringEnd } from "./json-text.ts";

// OpenAI's own limits: `tools` (and legacy `functions`), an assistant message's
// `tool_calls`, `n`, `stop`, and an embeddings request's inputs.
/** Most tools (or legacy functions, or `allowed_tools` entries) one request may declare. */
export const MAX_TOOLS = 128;
/** Most tool calls one assistant message may carry. */
export const MAX_TOOL_CALLS = 128;
/** Most sequences `n` asks for per prompt. */
export const MAX_N = 128;
/** Most stop sequences. */
export const MAX_STOP = 4;
/** Most prompts in a legacy completion's `prompt` list, or inputs in an embeddings request. */
export const MAX_PROMPTS = 2048;
/** Longest end-user id (`user`), in characters: kept in every ledger row of its requests. */
export const MAX_USER_LENGTH = 256;

// Bounds of our own, where OpenAI publishes none: generous for real clients, finite for
// the origins (each sequence holds a slot of the engine's batch until it ends).
/** Most sequences one legacy completion may generate: its prompts times `n` (or `best_of`). */
export const MAX_SEQUENCES = 2048;
/** Most messages in a chat request, or items in a Responses API `input`. */
export const MAX_MESSAGES = 16384;
/** Most entries in `logit_bias`. */
export const MAX_LOGIT_BIAS = 1024;
/**
 * Most levels a JSON schema may nest (`response_format`, tool `parameters`, `text.format`),
 * counted in objects and arrays: a property's schema sits two levels below its parent's.
 * OpenAI's structured outputs allow 10 levels of objects, about 20 of these.
 */
export const MAX_SCHEMA_DEPTH = 64;
/**
 * Most levels the whole body may nest, itself the first (serde_json's default recursion limit):
 * a top-level field such as `guided_json` gets one level fewer.
 */
export const MAX_BODY_DEPTH = 128;

/** A path where a free-form JSON schema sits; `"[]"` matches any array index. */
type SchemaPath = readonly string[];

/** Where each endpoint's bodies hold JSON schemas, which get {@link MAX_SCHEMA_DEPTH}. */
export const SCHEMA_PATHS = {
  chat: [
    ["response_format", "json_schema", "schema"],
    ["tools", "[]", "function", "parameters"],
    ["functions", "[]", "parameters"],
  ],
  completion: [],
  responses: [
    ["text", "format", "schema"],
    ["tools", "[]", "parameters"],
  ],
  embeddings: [],
} satisfies Record<string, readonly SchemaPath[]>;

/** A value nested deeper than its limit: where (`[]` is the body itself), how deep, and the limit. */
export interface DeepNesting {
  path: (string | number)[];
  depth: number;
  limit: number;
}

interface Root {
  path: (string | number)[];
  /** Nesting level of the root's own object or array (the body is level 1). */
  level: number;
  limit: number;
}

const QUOTE = 0x22;
const COMMA = 0x2c;
const OPEN_OBJECT = 0x7b;
const OPEN_ARRAY = 0x5b;
const CLOSE_OBJECT = 0x7d;
const CLOSE_ARRAY = 0x5d;

/**
 * The first top-level field, schema (at `schemaPaths`) or non-object body nested deeper than
 * its limit, with its full depth, or undefined. It reads `text` once, keeps keys and indices
 * only for the few levels where schemas start, and stops where the offending value ends.
 * Text that is not JSON gives some answer; parsing it will refuse it anyway.
 */
export function findDeepNesting(
  text: string,
  schemaPaths: readonly SchemaPath[],
): DeepNesting | undefined {
  const tracked = Math.max(1, ...schemaPaths.map((p) => p.length));
  // For each tracked level: is it an object, and its current key or index.
  const isObject: boolean[] = [];
  const at: (string | number)[] = [];
  const roots: Root[] = [];
  let expectKey = false;
  let level = 0;
  let deep: Root | undefined;
  let deepest = 0;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch === QUOTE) {
      const end = stringEnd(text, i);
      if (expectKey && level <= tracked) at[level - 1] = decodeKey(text.slice(i, end));
      expectKey = false;
      i = end - 1;
    } else if (ch === OPEN_OBJECT || ch === OPEN_ARRAY) {
      level++;
      if (deep !== undefined) {
        deepest = Math.max(deepest, level - deep.level + 1);
        continue;
      }
      const path = level <= tracked + 1 ? at.slice(0, level - 1) : undefined;
      if (path !== undefined) {
        // A field is named as the param; a body that is no object (refused later) is itself.
        if (level === 1 && ch === OPEN_ARRAY) roots.push({ path, level, limit: MAX_BODY_DEPTH });
        if (level === 2 && isObject[0]) roots.push({ path, level, limit: MAX_BODY_DEPTH - 1 });
        if (schemaPaths.some((pattern) => matches(pattern, path))) {
          roots.push({ path, level, limit: MAX_SCHEMA_DEPTH });
        }
      }
      deep = roots.find((root) => level - root.level + 1 > root.limit);
      if (deep !== undefined) deepest = level - deep.level + 1;
      if (level <= tracked) {
        isObject[level - 1] = ch === OPEN_OBJECT;
        at[level - 1] = 0;
      }
      expectKey = ch === OPEN_OBJECT;
    } else if (ch === CLOSE_OBJECT || ch === CLOSE_ARRAY) {
      if (level === 0) continue;
      if (deep !== undefined && level === deep.level) break;
      while (roots.at(-1)?.level === level) roots.pop();
      level--;
      expectKey = false;
    } else if (ch === COMMA && level > 0 && level <= tracked) {
      const index = at[level - 1];
      if (isObject[level - 1]) expectKey = true;
      else if (typeof index === "number") at[level - 1] = index + 1;
    }
  }
  return deep === undefined ? undefined : { path: deep.path, depth: deepest, limit: deep.limit };
}

function matches(pattern: SchemaPath, path: readonly (string | number)[]): boolean {
  if (pattern.length !== path.length) return false;
  return pattern.every((part, i) =>
    part === "[]" ? typeof path[i] === "number" : path[i] === part,
  );
}

function decodeKey(literal: string): string {
  if (!literal.includes("\\")) return literal.slice(1, -1);
  try {
    return JSON.parse(literal) as string;
  } catch {
    // Not JSON: parsing the body refuses it later.
    return literal;
  }
}

/** The 400 for {@link DeepNesting}, naming the field as OpenAI's `param`. */
export function nestingTooDeep({ path, depth, limit }: DeepNesting): ApiError {
  const param = path.length === 0 ? null : clipped(formatPath(path));
  const subject = param === null ? "The request body" : `'${param}'`;
  return invalidRequest(
    `${subject} is nested ${depth} levels deep; at most ${limit} are allowed.`,
    param,
    "json_above_max_depth",
  );
}

/** A zod check that a JSON object has at most `max` entries (a `too_big` issue, origin `object`). */
export function maxEntries(max: number) {
  return (record: Record<string, unknown>, ctx: z.RefinementCtx): void => {
    const size = Object.keys(record).length;
    if (size > max) {
      ctx.addIssue({
        code: "too_big",
        origin: "object",
        maximum: max,
        inclusive: true,
        input: record,
      });
    }
  };
}
