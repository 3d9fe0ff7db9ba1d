/**
 * The exact response cache's key (docs/cache.md, "The key"): a request body normalised so
 * that bodies an engine answers alike read alike (field order, OpenAI's defaults, `null`
 * for absent), with the delivery, route, model and tenant beside it, then hashed. Pure.
 */
import { hex } from "../../contracts/hashing.ts";
import type { DeliveryMode } from "../../contracts/delivery.ts";

/** Which API a body is for (its route). */
export type CacheKind = "chat" | "completion" | "responses" | "embeddings";

// OpenAI's defaults per API: a top-level field written with its default value reads as
// absent. Only fields that change nothing at their default are listed: every engine applies
// these alike (not `max_tokens`, whose default is the engine's own).
const DEFAULTS: Record<CacheKind, Record<string, unknown>> = {
  chat: {
    n: 1,
    temperature: 1,
    top_p: 1,
    presence_penalty: 0,
    frequency_penalty: 0,
    logprobs: false,
    parallel_tool_calls: true,
    store: false,
  },
  completion: {
    n: 1,
    best_of: 1,
    temperature: 1,
    top_p: 1,
    presence_penalty: 0,
    frequency_penalty: 0,
    echo: false,
  },
  responses: { temperature: 1, top_p: 1, parallel_tool_calls: true, store: true },
  embeddings: { encoding_format: "float" },
};

/** Whose entries a request may read and write. */
export type CacheScope =
  | { kind: "key"; keyId: string; endUser: string | null }
  | { kind: "team"; teamId: string; endUser: string | null }
  | { kind: "shared" };

/** What a request's cache key is made of. */
export interface CacheKeyInput {
  kind: CacheKind;
  /** The parsed request body. */
  body: Record<string, unknown>;
  delivery: DeliveryMode;
  scope: CacheScope;
  /** The caller's own name for the entry (`x-warmgate-cache-key`), replacing the body's. */
  customKey: string | null;
}

/**
 * The body as the cache compares it: keys sorted at every depth, top-level `null`s and
 * defaults dropped, `stream` dropped (the delivery is keyed beside it) and, for a whole
 * answer, `stream_options` too (it shapes only a stream's bytes).
 */
export function normalisedBody(
  kind: CacheKind,
  body: Record<string, unknown>,
  delivery: DeliveryMode,
): string {
  const defaults = DEFAULTS[kind];
  const kept: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(body)) {
    if (value === null || value === undefined || name === "stream") continue;
    if (name === "stream_options") {
      const options = streamOptions(value);
      if (delivery === "stream" && options !== null) kept[name] = options;
      continue;
    }
    if (Object.hasOwn(defaults, name) && defaults[name] === value) continue;
    kept[name] = value;
  }
  return canonicalJson(kept);
}

// `include_usage: false` is its default; options that are all defaults read as none.
function streamOptions(value: unknown): unknown {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return value;
  const options = Object.fromEntries(
    Object.entries(value).filter(([name, v]) => !(name === "include_usage" && v === false)),
  );
  return Object.keys(options).length === 0 ? null : options;
}

/** JSON with every object's keys in code-point order, so field order never matters. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

/** Everything that tells two requests' answers apart, as one string (before hashing). */
export function cacheKeyMaterial(input: CacheKeyInput): string {
  const { kind, body, delivery, scope, customKey } = input;
  const tenant =
    scope.kind === "shared"
      ? ["shared"]
      : scope.kind === "team"
        ? ["team", scope.teamId, scope.endUser]
        : ["key", scope.keyId, scope.endUser];
  const request =
    customKey === null
      ? ["body", normalisedBody(kind, body, delivery)]
      : [
          "named",
          customKey,
          canonicalJson(body["model"] ?? null),
          // A stream's bytes differ with its usage chunk, whatever the caller named it.
          delivery === "stream" ? canonicalJson(streamOptions(body["stream_options"] ?? null)) : "",
        ];
  return JSON.stringify(["v1", ...tenant, kind, delivery, ...request]);
}

/** The request's cache key: SHA-256 of its material, in hex. */
export async function cacheKey(input: CacheKeyInput): Promise<string> {
  const digest = await crypto.subtle.digest(
    "SHA-256",
    new TextEncoder().encode(cacheKeyMaterial(input)),
  );
  return hex(digest);
}

/**
 * Whether the body asks for an answer that repeats: `temperature: 0` (greedy decoding) or a
 * `seed`; an embedding always repeats.
 */
export function isDeterministic(kind: CacheKind, body: Record<string, unknown>): boolean {
  if (kind === "embeddings") return true;
  return body["temperature"] === 0 || typeof body["seed"] === "number";
}
