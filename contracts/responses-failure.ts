/**
 * How a Responses API stream ends when its origin fails after the first byte
 * (docs/edge.md, "Delivery"): OpenAI's typed `error` event, then `response.failed` with
 * the response as its `response.created` event began it. Chat and completion streams end
 * with `data: {"error":…}` ({@link errorEvent}); the edge and the Batchers write that one,
 * and a Responses stream's edge puts these two in its place.
 */
import { type ApiError, errorEvent, originFailure } from "./errors.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The chat-style endings of a failed item's body, as `errorEvent` writes them. */
const ENDINGS = (["bad_answer", "timeout"] as const).map((kind) => {
  const error = originFailure(kind);
  return { error, bytes: errorEvent(error) };
});

const SEQUENCE = /"sequence_number":\s*(\d+)/g;

/** The events that end a Responses stream failed with `error`, after events up to `seen`. */
export function responsesFailureEvents(
  error: ApiError,
  opening: string,
  seen: string,
  now: number,
): Uint8Array {
  const numbers = [...seen.matchAll(SEQUENCE)].map((m) => Number(m[1]));
  const next = numbers.length === 0 ? 0 : Math.max(...numbers) + 1;
  const failed = {
    ...createdResponse(opening, now),
    status: "failed",
    error: { code: error.code ?? "server_error", message: error.message },
  };
  const events = [
    { type: "error", code: error.code, message: error.message, param: null, sequence_number: next },
    { type: "response.failed", sequence_number: next + 1, response: failed },
  ];
  return encoder.encode(
    events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join(""),
  );
}

/** The `response` of the stream's `response.created` event, or a bare one when unreadable. */
function createdResponse(opening: string, now: number): Record<string, unknown> {
  for (const line of opening.split("\n")) {
    if (!line.startsWith("data:")) continue;
    try {
      const event = JSON.parse(line.slice(5)) as { type?: unknown; response?: unknown };
      if (event.type === "response.created" && typeof event.response === "object") {
        return { ...(event.response as Record<string, unknown>) };
      }
    } catch {
      // Cut inside the first event: no response to take.
    }
    break;
  }
  return { object: "response", created_at: Math.floor(now / 1000), output: [] };
}

function endsWith(chunk: Uint8Array, tail: Uint8Array): boolean {
  if (chunk.length < tail.length) return false;
  const from = chunk.length - tail.length;
  for (let i = 0; i < tail.length; i++) if (chunk[from + i] !== tail[i]) return false;
  return true;
}

/**
 * Passes a Responses stream's bytes on as they come, and replaces the chat-style error
 * event its body ends with, should it fail after the first byte, with
 * {@link responsesFailureEvents}. Holds on to the first and the previous chunk only.
 */
export function responsesFailureEnding(): TransformStream<Uint8Array, Uint8Array> {
  let first: Uint8Array | null = null;
  let previous: Uint8Array | null = null;
  return new TransformStream({
    transform(chunk, controller) {
      const ending = ENDINGS.find((e) => endsWith(chunk, e.bytes));
      if (ending === undefined) {
        first ??= chunk;
        previous = chunk;
        controller.enqueue(chunk);
        return;
      }
      const before = chunk.subarray(0, chunk.length - ending.bytes.length);
      if (before.length > 0) controller.enqueue(before);
      const seen = decoder.decode(previous ?? new Uint8Array()) + decoder.decode(before);
      const opening = decoder.decode(first ?? before);
      controller.enqueue(responsesFailureEvents(ending.error, opening, seen, Date.now()));
    },
  });
}
