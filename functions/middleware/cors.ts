/**
 * CORS on every `/v1/*` answer to a browser, refusals included: a page can read a 401 for
 * an expired token or a 429 instead of seeing "Failed to fetch" (which SDKs retry as a
 * connection error). An answer carries the headers when its key allowed the Origin, or
 * else when any active key does (the preflight's rule, cached per isolate).
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import { corsHeaders, originAllowedByAnyKey } from "../accounts/browser-token.ts";
import { setHeaders } from "./auth.ts";

/** Adds CORS headers to answers for an Origin that a key allows. */
export function browserCors() {
  return createMiddleware<AppEnv>(async function allowBrowsers(c, next) {
    await next();
    const origin = c.req.header("origin");
    if (origin === undefined || c.req.method === "OPTIONS") return;
    if (c.res.headers.has("access-control-allow-origin")) return;
    const allowed =
      c.get("allowedOrigin") === origin ||
      (await originAllowedByAnyKey(c.env, origin, Date.now(), c.get("edge").browserTokens).catch(
        () => false,
      ));
    if (allowed) setHeaders(c, corsHeaders(origin));
  });
}
