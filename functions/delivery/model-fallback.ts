/**
 * Alias fallback: an alias names models in the order to try them, and when one has no
 * origin that can answer (503 `no_healthy_origin`, or 502/504 before any byte reached the
 * client), the next model serves the request. Only the models the key's account admitted
 * are tried; the reservation already covers the priciest of them.
 * See docs/edge.md.
 */
import { logWarn } from "../../contracts/log.ts";
import type { Context } from "hono";
import type { AppEnv } from "../app-env.ts";
import { ApiError } from "../../contracts/errors.ts";

// The origin failures after which another model may still answer (see errors.ts).
const FALLBACK_CODES = new Set(["no_healthy_origin", "origin_error", "origin_timeout"]);

/** Whether a failure of one model lets the next model of an alias try. */
export function fallsBack(error: unknown): boolean {
  return error instanceof ApiError && error.code !== null && FALLBACK_CODES.has(error.code);
}

/**
 * Runs `send` with `c.var.plan.model` set to each admitted model in turn, until one
 * answers; the last model's failure is the client's.
 */
export async function withModelFallback(
  c: Context<AppEnv>,
  send: () => Promise<Response>,
): Promise<Response> {
  const { plan } = c.var;
  const admitted = c.get("admission")?.models;
  const models =
    admitted === undefined ? [plan.model] : plan.models.filter((m) => admitted.includes(m.id));
  for (const [i, model] of models.entries()) {
    c.set("plan", { ...plan, model });
    try {
      return await send();
    } catch (error) {
      if (i === models.length - 1 || !fallsBack(error)) throw error;
      logWarn("model has no origin that answers; trying the next", { model: model.id });
    }
  }
  // Unreachable for an admitted request (it has at least one model); send as planned.
  return send();
}
