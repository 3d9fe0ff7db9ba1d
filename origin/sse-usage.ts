/**
 * Usage in an engine's SSE stream: splitting the stream into events, asking for the usage
 * chunk (`stream_options.include_usage`) on the way in, and hiding exactly that chunk on
 * the way out when the client did not ask for it.
 * See docs/configuration.md, "The origin".
 */
import type { ItemUsage } from "../contracts/protocol/schema.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Splits an SSE byte stream into whole events (each with its blank-line terminator). */
export class SseSplitter {
  #buffer = new Uint8Array(0);

  /** Adds a chunk and returns the events it completes, byte for byte. */
  push(chunk: Uint8Array): Uint8Array[] {
    const data = new Uint8Array(this.#buffer.byteLength + chunk.byteLength);
    data.set(this.#buffer);
    data.set(chunk, this.#buffer.byteLength);
    const events: Uint8Array[] = [];
    let start = 0;
    for (let i = 0; i < data.byteLength; i++) {
      if (data[i] !== 0x0a) continue;
      // An event ends at "\n\n" or "\n\r\n" (CRLF line endings, per the SSE spec).
      if (data[i + 1] === 0x0a) {
        events.push(data.slice(start, i + 2));
        start = i + 2;
        i++;
      } else if (data[i + 1] === 0x0d && data[i + 2] === 0x0a) {
        events.push(data.slice(start, i + 3));
        start = i + 3;
        i += 2;
      }
    }
    this.#buffer = data.slice(start);
    return events;
  }

  /** Whatever is left when the stream ends (an unterminated event), possibly empty. */
  flush(): Uint8Array {
    const rest = this.#buffer;
    this.#buffer = new Uint8Array(0);
    return rest;
  }
}

/** Usage as chat, completions and embeddings report it, or as the Responses API does. */
export interface UsageJson {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
  input_tokens?: number;
  output_tokens?: number;
  input_tokens_details?: { cached_tokens?: number } | null;
}

export function toItemUsage(usage: UsageJson): ItemUsage {
  const prompt = usage.prompt_tokens ?? usage.input_tokens ?? 0;
  const completion = usage.completion_tokens ?? usage.output_tokens ?? 0;
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: usage.total_tokens ?? prompt + completion,
    cached_tokens:
      usage.prompt_tokens_details?.cached_tokens ?? usage.input_tokens_details?.cached_tokens ?? 0,
  };
}

/** Responses API stream events that end a response, each carrying the response with its usage. */
export const RESPONSE_END_EVENTS: ReadonlySet<string> = new Set([
  "response.completed",
  "response.incomplete",
  "response.failed",
]);

/** Whether the engine may be asked for a usage chunk: chat and completions streams only. */
export function takesStreamOptions(path: string): boolean {
  return path === "/v1/chat/completions" || path === "/v1/completions";
}

export function objectOrNull(text: string): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === "object" && value !== null && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : null;
  } catch {
    return null;
  }
}

/**
 * Asks a streaming request for usage when the client did not, so the origin can bill it.
 * Returns the body to send and whether the engine's usage output must be hidden again.
 */
export function requestUsage(body: string): { body: string; injected: boolean } {
  const request = objectOrNull(body);
  if (request === null || request.stream !== true) return { body, injected: false };
  const options = request.stream_options;
  if (options === null) {
    return reserialised(body, { ...request, stream_options: { include_usage: true } });
  }
  if (options === undefined) {
    // Textual insertion keeps every other byte of the client's body as it was.
    const at = body.indexOf("{");
    const rest = body.slice(at + 1);
    const separator = /^\s*\}/.test(rest) ? "" : ",";
    return {
      body: `${body.slice(0, at + 1)}"stream_options":{"include_usage":true}${separator}${rest}`,
      injected: true,
    };
  }
  if (
    typeof options === "object" &&
    (options as { include_usage?: unknown }).include_usage !== true
  ) {
    return reserialised(body, {
      ...request,
      stream_options: { ...options, include_usage: true },
    });
  }
  return { body, injected: false };
}

/**
 * `request` as the body to send; the client's `body` untouched when it nests too deeply to
 * serialise (JSON.stringify recurses), so the engine judges it, as it would without us.
 */
function reserialised(body: string, request: object): { body: string; injected: boolean } {
  try {
    return { body: JSON.stringify(request), injected: true };
  } catch {
    return { body, injected: false };
  }
}

const USAGE_NULL_AFTER = /,\s*"usage"\s*:\s*null(?=\s*[,}])/g;
const USAGE_NULL_BEFORE = /"usage"\s*:\s*null\s*,\s*/g;

/**
 * What the client would have received for one SSE event had it not asked for usage:
 * null for the usage-only chunk, the event without its `"usage":null` otherwise.
 */
export function hideInjectedUsage(event: Uint8Array): Uint8Array | null {
  const text = decoder.decode(event);
  if (!text.includes('"usage"')) return event;
  const data = dataOf(text);
  if (data !== null) {
    const chunk = objectOrNull(data);
    if (
      chunk !== null &&
      Array.isArray(chunk.choices) &&
      chunk.choices.length === 0 &&
      chunk.usage !== null &&
      chunk.usage !== undefined
    ) {
      return null;
    }
  }
  // A raw `"usage"` can only be a key: quotes inside JSON strings are escaped.
  let edited = text.replace(USAGE_NULL_AFTER, "");
  if (edited === text) edited = text.replace(USAGE_NULL_BEFORE, "");
  return edited === text ? event : encoder.encode(edited);
}

/** The joined `data:` lines of one SSE event, or null when it has none. */
export function dataOf(event: string): string | null {
  const lines: string[] = [];
  for (const line of event.split(/\r?\n/)) {
    if (line.startsWith("data:")) lines.push(line.slice(line.startsWith("data: ") ? 6 : 5));
  }
  return lines.length > 0 ? lines.join("\n") : null;
}
