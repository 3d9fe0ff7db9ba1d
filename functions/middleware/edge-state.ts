/**
 * Puts the isolate's state (`functions/edge-state.ts`) on `c.var.edge`, for the request
 * path to pass down. See docs/edge.md, "Isolate state".
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import type { EdgeState } from "../edge-state.ts";

/** Sets `c.var.edge` to the isolate's one state. */
export function isolateState(edge: EdgeState) {
  return createMiddleware<AppEnv>(async function putEdgeState(c, next) {
    c.set("edge", edge);
    await next();
  });
}
