/**
 * `GET /metrics` (Prometheus text) and `GET /admin/stats` (the dashboard's JSON), behind
 * the admin token; both gather the fleet from the Durable Objects that own its figures
 * when asked. The dashboard page itself is a static asset (`dashboard/public`).
 * See docs/metrics.md.
 */
import { Hono } from "hono";
import { adminAuth } from "../middleware/admin-auth.ts";
import type { AppEnv } from "../app-env.ts";
import { collectFleet } from "../observability/collect.ts";
import { renderFleet } from "../observability/exposition.ts";
import { summarize } from "../observability/summary.ts";
import { methodNotAllowed } from "../error-handler.ts";

/** `GET /metrics`, mounted at `/metrics`. */
export const metrics = new Hono<AppEnv>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    const stats = await collectFleet(c.env, c.var.config, c.var.edge.answers);
    return c.body(renderFleet(stats), 200, {
      "content-type": "text/plain; version=0.0.4; charset=utf-8",
      "cache-control": "no-store",
    });
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]));

/** `GET /admin/stats`, mounted at `/admin/stats`. */
export const stats = new Hono<AppEnv>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    const collected = await collectFleet(c.env, c.var.config, c.var.edge.answers);
    c.header("cache-control", "no-store");
    return c.json(summarize(collected, c.var.config));
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]));
