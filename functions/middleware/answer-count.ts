/**
 * Counts every answer the edge gives, refusals before any key's account included, by
 * route group, status class and error code (docs/metrics.md, "Every answer"): an increment
 * in the isolate's map, and a bulk push every few seconds under `waitUntil`.
 */
import type { Context } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import { waitUntilOf } from "./request-context.ts";

/** Counts the answer once the rest of the app has made it. */
export function countAnswers() {
  return createMiddleware<AppEnv>(async function countAnswer(c, next) {
    await next();
    const { answers } = c.get("edge");
    const { status } = c.res;
    const waitUntil = waitUntilOf(c);
    const path = c.req.path;
    if (status < 400) {
      answers.count({ path, status, code: "none" });
    } else {
      const at = Date.now();
      const error = {
        requestId: c.get("requestId"),
        at,
        method: c.req.method,
        model: modelOf(c),
        keyId: c.get("credential")?.keyId ?? null,
      };
      // An error body is small and whole: its `code` (the origin's own, for an answer it
      // gave) is read from a copy, off the response path.
      const copy = c.res.clone();
      waitUntil(errorCode(copy).then((code) => answers.count({ path, status, code }, error)));
    }
    const now = Date.now();
    if (answers.due(now)) waitUntil(answers.push(now));
  });
}

function modelOf(c: Context<AppEnv>): string | null {
  const planned = c.get("plan")?.model.id;
  if (planned !== undefined) return planned;
  const asked: unknown = c.get("completion")?.body.model;
  return typeof asked === "string" ? asked.slice(0, 128) : null;
}

type ErrorFields = { code?: unknown; type?: unknown };

/** The `error.code` of an OpenAI-shaped body (or, where vLLM put a number there, its `type`). */
async function errorCode(response: Response): Promise<string> {
  try {
    const body: unknown = await response.json();
    // OpenAI's shape nests the error; older vLLM answers put its fields at the top.
    const shaped = body as { error?: ErrorFields } | null;
    const error: ErrorFields | undefined =
      shaped?.error ?? (shaped as ErrorFields | null) ?? undefined;
    if (typeof error?.code === "string") return error.code;
    // vLLM's code is the HTTP status; its `type` (`BadRequestError`) says more.
    if (typeof error?.code === "number" && typeof error.type === "string") return error.type;
    return "none";
  } catch {
    return "none";
  }
}
