/**
 * Alias fallback: an alias names models in the order to try them, and when one has no
 * origin that can answer (503 `no_healthy_origin`, or 502/504 before any byte reached the
 * client), the next model serves the request. Only the models the key's account admitted
 * are tried; the reservation already covers the priciest of them. The outermost of the
 * retry levels of `delivery/retry.ts`. See docs/edge.md.
 */
import { logWarn } from "../../contracts/log.ts";
import type { Context } from "hono";
import type { AppEnv } from "../app-env.ts";
import { fallsBack } from "./retry.ts";

/**
 * Runs `send` with `c.var.plan.model` set to each admitted model in turn, until one
 * answers; the last model's failure is the client's.
 */
export async function withModelFallback(
  c: Context<AppEnv>,
  send: () => Promise<Response>,
): Promise<Response> {
  const plan = c.get("plan");
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
