/**
 * Loads the validated configuration into `c.var.config` (parsed once per isolate); a bad
 * configuration answers every request with a 500 `config_error` naming the bad field.
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import { ConfigError, loadConfig } from "../../contracts/config/gateway.ts";
import { configError } from "../../contracts/errors.ts";

/** Puts the gateway configuration on the context. */
export function gatewayConfig() {
  return createMiddleware<AppEnv>(async function putConfig(c, next) {
    try {
      c.set("config", loadConfig(c.env.WARMGATE_CONFIG));
    } catch (error) {
      if (error instanceof ConfigError) throw configError(error.message);
      throw error;
    }
    await next();
  });
}
