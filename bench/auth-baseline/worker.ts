/**
 * The edge as it was before per-key accounts, for `npm run bench:auth`: the same request
 * context, configuration, validation, planning and dispatch, but a static key compared in
 * constant time instead of the KeyAccount's admission and settlement. Benchmark only:
 * nothing here is metered, so it never ships.
 */
import { Hono } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../../functions/app-env.ts";
import { handleError, handleNotFound } from "../../functions/error-handler.ts";
import { incorrectApiKey } from "../../functions/errors.ts";
import { bearerToken } from "../../functions/keys.ts";
import { completionBody } from "../../functions/middleware/completion-body.ts";
import { planCompletion } from "../../functions/middleware/completion-plan.ts";
import { gatewayConfig } from "../../functions/middleware/gateway-config.ts";
import { requestContext } from "../../functions/middleware/request-context.ts";
import { forward } from "../../functions/routes/completions.ts";
import { health } from "../../functions/routes/health.ts";

const encoder = new TextEncoder();

function staticKey() {
  return createMiddleware<AppEnv>(async function compareStaticKey(c, next) {
    const expected = encoder.encode((c.env as Env & { BENCH_API_KEY?: string }).BENCH_API_KEY);
    const presented = encoder.encode(bearerToken(c.req.header("authorization")) ?? "");
    const ok =
      expected.byteLength > 0 &&
      expected.byteLength === presented.byteLength &&
      crypto.subtle.timingSafeEqual(expected, presented);
    if (!ok) throw incorrectApiKey();
    c.set("caller", { kind: "key", keyId: "bench" });
    await next();
  });
}

const app = new Hono<AppEnv>();
app.use(requestContext());
app.use(gatewayConfig());
app.route("/health", health);
app.use("/v1/*", staticKey());
app.post("/v1/chat/completions", completionBody("chat"), planCompletion(), (c) =>
  forward(c, "/v1/chat/completions"),
);
app.notFound(handleNotFound);
app.onError(handleError);

export default app satisfies ExportedHandler<Env>;
export { Batcher } from "../../durable-objects/batcher.ts";
