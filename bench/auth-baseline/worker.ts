/**
 * The edge without per-key accounts, for `npm run bench:auth` (docs/benchmarks.md); never
 * shipped. `BENCH_MODE` picks what stands in for the account: `static`, a static key
 * compared in constant time, then the same validation, planning and dispatch; `local`, the
 * edge's own keyed path with the admission answered in the isolate and nothing settled.
 */
import { env as bindings } from "cloudflare:workers";
import { Hono } from "hono";
import { createMiddleware } from "hono/factory";
import type { RateLimitInfo } from "../../durable-objects/key-account/types.ts";
import { formatUsd } from "../../contracts/pricing.ts";
import type { AppEnv } from "../../functions/app-env.ts";
import { EdgeState } from "../../functions/edge-state.ts";
import { handleError, handleNotFound } from "../../functions/error-handler.ts";
import { invalidApiKey, originFailure } from "../../contracts/errors.ts";
import { bearerToken } from "../../functions/accounts/keys.ts";
import {
  COST_HEADER,
  authenticate,
  setHeaders,
  usageCost,
} from "../../functions/middleware/auth.ts";
import { completionBody } from "../../functions/middleware/completion-body.ts";
import { planCompletion } from "../../functions/middleware/completion-plan.ts";
import { isolateState } from "../../functions/middleware/edge-state.ts";
import { gatewayConfig } from "../../functions/middleware/gateway-config.ts";
import { requestContext } from "../../functions/middleware/request-context.ts";
import { withModelFallback } from "../../functions/delivery/model-fallback.ts";
import { rateLimitHeaders } from "../../functions/accounts/rate-limit-headers.ts";
import { forward } from "../../functions/routes/completions.ts";
import { health } from "../../functions/routes/health.ts";

type BenchEnv = Env & { BENCH_API_KEY?: string; BENCH_MODE?: string };

const encoder = new TextEncoder();

const UNLIMITED: RateLimitInfo = {
  requests: { limit: 100_000_000, remaining: 99_999_999, resetMs: 1 },
  tokens: { limit: 1_000_000_000_000, remaining: 999_999_999_999, resetMs: 1 },
};

function staticKey() {
  return createMiddleware<AppEnv>(async function compareStaticKey(c, next) {
    const expected = encoder.encode((c.env as BenchEnv).BENCH_API_KEY);
    const presented = encoder.encode(bearerToken(c.req.header("authorization")) ?? "");
    const ok =
      expected.byteLength > 0 &&
      expected.byteLength === presented.byteLength &&
      crypto.subtle.timingSafeEqual(expected, presented);
    if (!ok) throw invalidApiKey();
    c.set("caller", { kind: "key", keyId: "bench" });
    await next();
  });
}

// The admission middleware's work without the account: headers, and the JSON answer read
// whole for its cost header.
function localAdmission() {
  return createMiddleware<AppEnv>(async function admitLocally(c, next) {
    const { plan, requestId, settlement } = c.var;
    const models = plan.models.map((model) => model.id);
    c.set("admission", {
      ok: true,
      models,
      reservedTokens: 0,
      reservedPicos: 0n,
      rateLimit: UNLIMITED,
      requestId,
      tier: "standard",
      allowRegionOverride: true,
      teamId: null,
      leaseExpiresAt: 0,
      budgeted: false,
    });
    await next();
    if (plan.delivery === "whole") {
      let bytes: ArrayBuffer;
      try {
        bytes = await c.res.arrayBuffer();
      } catch {
        throw originFailure("bad_answer");
      }
      c.res = new Response(bytes, c.res);
      const cost = usageCost(c.var.config, settlement.record, models);
      setHeaders(c, { [COST_HEADER]: formatUsd(cost) });
    }
    setHeaders(c, rateLimitHeaders(UNLIMITED));
  });
}

function benchApp(mode: "static" | "local", edge: EdgeState): Hono<AppEnv> {
  const app = new Hono<AppEnv>();
  app.use(isolateState(edge));
  app.use(requestContext());
  app.use(gatewayConfig());
  app.route("/health", health);
  if (mode === "local") {
    app.use("/v1/*", authenticate());
    app.post(
      "/v1/chat/completions",
      completionBody("chat"),
      planCompletion(),
      localAdmission(),
      (c) => withModelFallback(c, () => forward(c, "/v1/chat/completions")),
    );
  } else {
    app.use("/v1/*", staticKey());
    app.post("/v1/chat/completions", completionBody("chat"), planCompletion(), (c) =>
      forward(c, "/v1/chat/completions"),
    );
  }
  app.notFound(handleNotFound);
  app.onError(handleError);
  return app;
}

// One isolate, one state, whichever app answers.
const edge = new EdgeState(bindings);
const apps = { static: benchApp("static", edge), local: benchApp("local", edge) };

export default {
  fetch(request, env, ctx) {
    const mode = (env as BenchEnv).BENCH_MODE === "local" ? "local" : "static";
    return apps[mode].fetch(request, env, ctx);
  },
} satisfies ExportedHandler<Env>;
export { Batcher } from "../../durable-objects/batcher/index.ts";
export { Canaries } from "../../durable-objects/canaries/index.ts";
export { OriginBreakers } from "../../durable-objects/origin-breakers/index.ts";
