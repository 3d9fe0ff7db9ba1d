/**
 * How much one request may ask of the simulated engine: poison input gets a 400 that names
 * the limit, as a real engine's validation answers it, never a stack overflow (a 500 that
 * reads as a sick origin) or seconds of planning that stall every other request.
 * See docs/configuration.md, "The simulated engine".
 */

/** Deepest nesting of objects and arrays in a body (serde_json's recursion limit). */
export const MAX_BODY_DEPTH = 128;
/** Most tools one request offers (OpenAI's limit). */
export const MAX_TOOLS = 128;
/** Most sequences one request starts: its prompts (a completions list) times `n`. */
export const MAX_SEQUENCES = 2048;

/** Keys of the path a depth error names as its param (`tools[0].function.parameters`). */
const PARAM_KEYS = 3;

interface Frame {
  value: object;
  depth: number;
  param: string;
  keys: number;
  /** The param takes no more segments: it has its keys, or met a second index in a row. */
  frozen: boolean;
  afterKey: boolean;
}

function child(parent: Frame, value: object, key: string | number): Frame {
  const depth = parent.depth + 1;
  const { param, keys } = parent;
  if (parent.frozen || (typeof key === "number" && !parent.afterKey)) {
    return { value, depth, param, keys, frozen: true, afterKey: false };
  }
  if (typeof key === "number") {
    return { value, depth, param: `${param}[${key}]`, keys, frozen: false, afterKey: false };
  }
  const named = param === "" ? key : `${param}.${key}`;
  return {
    value,
    depth,
    param: named,
    keys: keys + 1,
    frozen: keys + 1 >= PARAM_KEYS,
    afterKey: true,
  };
}

/**
 * Where `value` nests objects and arrays deeper than `maxDepth` (the body itself is level 1),
 * as a param path, or null when it does not. It walks with a stack of its own: V8's
 * JSON.parse does not recurse, but a recursive walk or JSON.stringify of such a value
 * overflows the call stack.
 */
export function tooDeepAt(value: unknown, maxDepth = MAX_BODY_DEPTH): string | null {
  if (typeof value !== "object" || value === null) return null;
  const stack: Frame[] = [{ value, depth: 1, param: "", keys: 0, frozen: false, afterKey: false }];
  for (let frame = stack.pop(); frame !== undefined; frame = stack.pop()) {
    if (frame.depth > maxDepth) return frame.param === "" ? "body" : frame.param;
    const node = frame.value;
    if (Array.isArray(node)) {
      for (let i = 0; i < node.length; i++) {
        const item: unknown = node[i];
        if (typeof item === "object" && item !== null) stack.push(child(frame, item, i));
      }
      continue;
    }
    for (const key in node) {
      const item: unknown = (node as Record<string, unknown>)[key];
      if (typeof item === "object" && item !== null) stack.push(child(frame, item, key));
    }
  }
  return null;
}
