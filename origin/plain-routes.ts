/**
 * The OpenAI-compatible routes of an origin (origin/PROTOCOL.md): each request becomes one
 * item on the engine, its bytes streamed back as the engine writes them, and a client that
 * goes away aborts its item.
 */
import { randomUUID } from "node:crypto";
import type { Context, Hono } from "hono";
import { STREAM_DROPPED_CODE } from "./faults.ts";
import { type ItemRunner, drain } from "./items.ts";
import type { ItemRoute, OriginCounters } from "./metrics.ts";
import type { ItemPath } from "../contracts/protocol/schema.ts";
import { outgoingOf } from "./http.ts";

/** What the OpenAI routes share with the rest of the origin. */
export interface PlainRouteDeps {
  items: ItemRunner;
  counters: OriginCounters;
  originId: string;
}

/** Headers of a client request that reach the engine. */
const FORWARDED_HEADERS = new Set([
  "accept",
  "user-agent",
  "x-request-id",
  "traceparent",
  "tracestate",
]);
function plainRoute(deps: PlainRouteDeps, path: ItemPath, route: Exclude<ItemRoute, "batch">) {
  const { items, counters, originId } = deps;
  return async function openaiRoute(c: Context): Promise<Response> {
    counters.requests[route]++;
    const body = await c.req.text();
    const headers: Record<string, string> = {};
    for (const [name, value] of c.req.raw.headers) {
      if (FORWARDED_HEADERS.has(name) || name.startsWith("x-warmgate-")) headers[name] = value;
    }
    const id = headers["x-request-id"] ?? `req-${randomUUID()}`;
    const priority = Number(headers["x-warmgate-priority"] ?? 0);
    const run = items.newRun();
    const clientSignal = c.req.raw.signal;
    if (clientSignal.aborted) items.abortItem(run, "client");
    else
      clientSignal.addEventListener("abort", () => items.abortItem(run, "client"), {
        once: true,
      });

    const opened = await items.openItem(
      { id, path, body, headers, priority: Number.isFinite(priority) ? priority : 0 },
      run,
    );
    let cancelled = false;
    const stream = new ReadableStream<Uint8Array>(
      {
        async pull(controller) {
          let next: IteratorResult<Uint8Array>;
          try {
            next = await opened.body.next();
          } catch {
            next = { done: true, value: undefined };
          }
          if (cancelled) return;
          if (next.done !== true) {
            controller.enqueue(next.value);
            return;
          }
          const trailer = await opened.finish();
          if (cancelled) return;
          if (trailer.error?.code === STREAM_DROPPED_CODE) {
            // A dropped stream must look like a lost connection: no terminating chunk.
            const outgoing = outgoingOf(c);
            if (outgoing !== null) outgoing.destroy();
            else controller.error(new Error("stream dropped"));
          } else {
            controller.close();
          }
        },
        async cancel() {
          cancelled = true;
          items.abortItem(run, "client");
          await drain(opened.body);
          await opened.finish();
        },
      },
      { highWaterMark: 0 },
    );
    return new Response(stream, {
      status: opened.status,
      headers: { ...opened.headers, "x-request-id": id, "x-warmgate-origin": originId },
    });
  };
}

/** Adds `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses` and `/v1/embeddings`. */
export function plainRoutes(app: Hono, deps: PlainRouteDeps): void {
  app.post("/v1/chat/completions", plainRoute(deps, "/v1/chat/completions", "chat"));
  app.post("/v1/completions", plainRoute(deps, "/v1/completions", "completions"));
  app.post("/v1/responses", plainRoute(deps, "/v1/responses", "responses"));
  app.post("/v1/embeddings", plainRoute(deps, "/v1/embeddings", "embeddings"));
}
