/**
 * `GET /health`: the edge is up and its configuration is valid (a bad one answers 500).
 * See docs/edge.md.
 */
import { Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { methodNotAllowed } from "../error-handler.ts";

/** The health route group, mounted at `/health`. */
export const health = new Hono<AppEnv>()
  .get("/", (c) => c.json({ status: "ok" }))
  .all("/", methodNotAllowed(["GET", "HEAD"]));
