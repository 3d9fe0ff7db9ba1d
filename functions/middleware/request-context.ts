/**
 * Gives every request its `x-request-id` (echoing the client's `x-client-request-id`, as
 * OpenAI does) and its {@link Settlement}; settles requests the edge answered itself.
 * See docs/edge.md.
 */
import type { Context } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import { Settlement } from "../accounts/settlement.ts";

/** Header OpenAI puts its request id in. */
export const REQUEST_ID_HEADER = "x-request-id";
/** Header a client may set to correlate; OpenAI accepts up to 512 ASCII characters. */
export const CLIENT_REQUEST_ID_HEADER = "x-client-request-id";

const PRINTABLE_ASCII = /^[\x20-\x7e]{1,512}$/;

/** A new id in OpenAI's format: `req_` and 32 hex digits. */
export function newRequestId(): string {
  return `req_${crypto.randomUUID().replaceAll("-", "")}`;
}

/** The request's `waitUntil`: keeps a promise's work alive past the response. */
export function waitUntilOf(c: Context<AppEnv>): (promise: Promise<unknown>) => void {
  try {
    const ctx = c.executionCtx;
    return (promise) => ctx.waitUntil(promise);
  } catch {
    // No execution context (a bare `app.request` in tests): nothing to keep alive.
    return (promise) => void promise.catch(() => {});
  }
}

/** Assigns the request id and settlement; runs first, so every response carries the id. */
export function requestContext() {
  return createMiddleware<AppEnv>(async function assignRequestContext(c, next) {
    const requestId = newRequestId();
    const settlement = new Settlement(requestId, waitUntilOf(c));
    c.set("requestId", requestId);
    c.set("settlement", settlement);
    await next();
    // Its admission may have named it anew (a lease names its requests).
    const named = c.get("requestId");
    // A response passed through from fetch() has immutable headers; re-wrap it (no copy of the body).
    try {
      c.res.headers.set(REQUEST_ID_HEADER, named);
    } catch {
      c.res = new Response(c.res.body, c.res);
      c.res.headers.set(REQUEST_ID_HEADER, named);
    }
    const clientId = c.req.header(CLIENT_REQUEST_ID_HEADER);
    if (clientId !== undefined && PRINTABLE_ASCII.test(clientId)) {
      c.res.headers.set(CLIENT_REQUEST_ID_HEADER, clientId);
    }
    // A streamed completion settles when its stream ends; everything else ends here.
    if (!settlement.held) {
      const plan = c.get("plan");
      settlement.settle({
        model: plan?.model.id ?? null,
        // A client that went away before its answer (a request cancelled while it waited).
        outcome: c.req.raw.signal.aborted ? "cancelled" : c.res.status < 400 ? "ok" : "error",
        usage: null,
        region: null,
        origin: null,
        status: c.res.status,
        originBegan: false,
      });
    }
  });
}
