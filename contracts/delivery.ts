/**
 * How a client gets its answer (docs/edge.md, "Delivery"): streamed as it comes, or whole
 * once it ended. The edge's plan decides it once; it travels as this one value to the
 * direct path, the response lifecycle and every Batcher.
 */

/** Streamed as it comes (`stream: true`), or whole once it ended. */
export type DeliveryMode = "stream" | "whole";

/**
 * Fewest completion tokens a streamed answer may run to for the edge to have its origin's
 * runtime pipe it to the client (`raw-item.ts`): its END is then its origin's outcome record,
 * asked together with others that end near it (`outcome-asks.ts`). From 16 tokens on the pipe
 * costs less than relaying the frames through JavaScript, a stream alone included; a stream
 * that may stay shorter is relayed frame by frame (docs/edge.md, "Delivery").
 */
export const PIPED_MIN_TOKENS = 16;

/** Whether a request's stream is piped raw: streamed, and may run to {@link PIPED_MIN_TOKENS}. */
export function pipesRaw(delivery: DeliveryMode, maxTokens: number): boolean {
  return delivery === "stream" && maxTokens >= PIPED_MIN_TOKENS;
}

/**
 * How an answer whose HEAD came reaches its client: as requested, except that an engine's
 * own error answer to a streamed request is JSON, whole as it is (the one content-type check).
 */
export function answerDelivery(requested: DeliveryMode, headers: Record<string, string>) {
  const delivery: DeliveryMode =
    requested === "stream" && isEventStream(headers) ? "stream" : "whole";
  return delivery;
}

function isEventStream(headers: Record<string, string>): boolean {
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() === "content-type") return value.startsWith("text/event-stream");
  }
  return false;
}
