/**
 * How a client gets its answer (docs/edge.md, "Delivery"): streamed as it comes, or whole
 * once it ended. The edge's plan decides it once; it travels as this one value to the
 * direct path, the response lifecycle and every Batcher.
 */

/** Streamed as it comes (`stream: true`), or whole once it ended. */
export type DeliveryMode = "stream" | "whole";

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
