/**
 * `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses` and `/v1/embeddings`:
 * validate, plan, pick origins and stream the origin's answer back unchanged.
 * See docs/edge.md.
 */
import { rateLimitHeaders } from "../accounts/rate-limit-headers.ts";
import { type Context, Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { PRIORITY_HEADER, checkPriority } from "../delivery/batcher-plan.ts";
import { methodNotAllowed } from "../error-handler.ts";
import { clipped, invalidRequest, notFound, notOffered } from "../../contracts/errors.ts";
import { replaceTopLevelString } from "../request/json-text.ts";
import { admitCompletion, verifyCredential } from "../middleware/auth.ts";
import { cachePolicy, responseCache } from "../cache/middleware.ts";
import { completionBody } from "../middleware/completion-body.ts";
import { withModelFallback } from "../delivery/model-fallback.ts";
import { planCompletion, sequenceAllowance } from "../middleware/completion-plan.ts";
import { waitUntilOf } from "../middleware/request-context.ts";
import {
  ORIGIN_OVERRIDE_HEADER,
  allowOverride,
  attemptRoutes,
  pinnedOrigin,
} from "../delivery/prefix-route.ts";
import type { RegionConfig } from "../../contracts/config/regions.ts";
import { type CallerLocation, regionOrder } from "../delivery/region-choice.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";

/** Request header that picks the first region to try (for tests and diagnostics). */
export const REGION_OVERRIDE_HEADER = "x-warmgate-region";

// Request headers worth passing to the engine; never credentials.
const FORWARDED_HEADERS = ["traceparent", "tracestate", "user-agent"] as const;

function callerLocation(request: Request): CallerLocation {
  const cf = request.cf as IncomingRequestCfProperties | undefined;
  return { colo: cf?.colo, country: cf?.country ?? undefined, continent: cf?.continent };
}

/** Sends the planned completion to the origins and answers with their response. */
export async function forward(c: Context<AppEnv>, path: ItemPath): Promise<Response> {
  // One lookup each: Hono builds all of `c.var` afresh on every read of it.
  const config = c.get("config");
  const plan = c.get("plan");
  const completion = c.get("completion");
  const settlement = c.get("settlement");
  const requestId = c.get("requestId");
  const edge = c.get("edge");
  const pinned = pinnedOrigin(c);
  const regions = regionsToTry(c, pinned?.region ?? null);
  const priority = c.req.header(PRIORITY_HEADER);
  checkPriority(priority);
  const headers: Record<string, string> = { "x-request-id": requestId };
  for (const name of FORWARDED_HEADERS) {
    const value = c.req.header(name);
    if (value !== undefined) headers[name] = value;
  }
  const admission = c.get("admission");
  return edge.dispatcher.dispatch({
    config,
    path,
    model: plan.model,
    delivery: plan.delivery,
    promptTokens: plan.promptTokens,
    maxTokens: sequenceAllowance(plan, plan.model),
    // Only an alias changes the text: the origin knows models by id.
    body:
      completion.body.model === plan.model.id
        ? completion.text
        : replaceTopLevelString(completion.text, "model", plan.model.id),
    headers,
    ...(admission !== undefined && {
      answerHeaders: Object.entries(rateLimitHeaders(admission.rateLimit)),
    }),
    regions,
    pinned,
    settlement,
    env: c.env,
    lane: {
      tier: admission?.tier,
      priority,
      keyId: c.get("caller")?.keyId,
      route: attemptRoutes(c, pinned?.id ?? null),
    },
    signal: c.req.raw.signal,
    waitUntil: waitUntilOf(c),
  });
}

/**
 * The regions to try, nearest the caller first, or from the override header, or the
 * region of the origin `x-warmgate-origin` pins.
 */
function regionsToTry(c: Context<AppEnv>, pinned: RegionConfig | null): readonly RegionConfig[] {
  const config = c.get("config");
  const override = c.req.header(REGION_OVERRIDE_HEADER);
  if (override !== undefined) allowOverride(c, REGION_OVERRIDE_HEADER, "region");
  const named = override !== undefined && override !== "" ? override : pinned?.id;
  // Reading `request.cf` parses it; with an override or a single region, where the caller
  // is decides nothing.
  const located = named === undefined && config.regions.length > 1;
  const order = regionOrder(config, located ? callerLocation(c.req.raw) : {}, named);
  if (order.kind === "unknown_region") {
    throw invalidRequest(
      `Unknown region '${clipped(order.region)}' in the ${REGION_OVERRIDE_HEADER} header.`,
      REGION_OVERRIDE_HEADER,
      "invalid_region",
    );
  }
  if (pinned !== null && order.regions[0] !== pinned) {
    throw invalidRequest(
      `The origin in the ${ORIGIN_OVERRIDE_HEADER} header is in region '${pinned.id}', not in '${clipped(override ?? "")}' named by the ${REGION_OVERRIDE_HEADER} header.`,
      ORIGIN_OVERRIDE_HEADER,
      "invalid_origin",
    );
  }
  return order.regions;
}

/** The completion route group, mounted at `/v1`. */
export const completions = new Hono<AppEnv>()
  .post(
    "/chat/completions",
    completionBody("chat"),
    planCompletion(),
    cachePolicy(),
    admitCompletion(),
    responseCache(),
    (c) => withModelFallback(c, () => forward(c, "/v1/chat/completions")),
  )
  .all("/chat/completions", methodNotAllowed(["POST"]))
  .post(
    "/completions",
    completionBody("completion"),
    planCompletion(),
    cachePolicy(),
    admitCompletion(),
    responseCache(),
    (c) => withModelFallback(c, () => forward(c, "/v1/completions")),
  )
  .all("/completions", methodNotAllowed(["POST"]))
  .post(
    "/responses",
    completionBody("responses"),
    planCompletion(),
    cachePolicy(),
    admitCompletion(),
    responseCache(),
    (c) => withModelFallback(c, () => forward(c, "/v1/responses")),
  )
  .all("/responses", methodNotAllowed(["POST"]))
  // Nothing here is the caller's: the edge's authentication suffices, as for an unknown URL.
  .all("/responses/input_tokens", () => {
    throw notOffered(
      "Counting input tokens (POST /v1/responses/input_tokens) is not offered by this gateway: a response's usage.input_tokens is the count its origin made.",
    );
  })
  // A stored response would be the caller's: only a valid key learns that none is kept.
  .all("/responses/:id{.+}", verifyCredential(), (c) => {
    throw notFound(
      `No response '${clipped(c.req.param("id").split("/")[0] ?? "")}' is stored: this gateway keeps no responses, so they cannot be retrieved, cancelled or deleted.`,
      "response_not_found",
      "response_id",
    );
  })
  .post(
    "/embeddings",
    completionBody("embeddings"),
    planCompletion(),
    cachePolicy(),
    admitCompletion(),
    responseCache(),
    (c) => withModelFallback(c, () => forward(c, "/v1/embeddings")),
  )
  .all("/embeddings", methodNotAllowed(["POST"]));
