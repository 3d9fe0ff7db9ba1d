/**
 * What the router needs of a request (docs/routing.md, "At the edge"): its prefix blocks
 * per model, its session (the OpenAI `user` field or `x-warmgate-session`), and an origin
 * it asks for with `x-warmgate-origin`, which only a key allowed to choose its region may.
 */
import type { Context } from "hono";
import {
  MAX_ROUTE_BLOCKS,
  type PrefixRequest,
  promptBlocks,
} from "../../contracts/prefix-blocks.ts";
import { ApiError, clipped, invalidRequest } from "../../contracts/errors.ts";
import type { RegionConfig } from "../../contracts/config/regions.ts";
import type { AttemptRoute } from "../../durable-objects/batcher/types.ts";
import type { AppEnv } from "../app-env.ts";

/** Request header that names the origin to send a request to (for tests and diagnostics). */
export const ORIGIN_OVERRIDE_HEADER = "x-warmgate-origin";
/** Request header that names a session: its requests keep to one origin while it is warm. */
export const SESSION_HEADER = "x-warmgate-session";

/** Longest session name kept. */
const MAX_SESSION_CHARS = 256;

/**
 * The origin `x-warmgate-origin` asks for and its region, or null without the header.
 * Throws the OpenAI-shaped errors of a refused or unknown origin.
 */
export function pinnedOrigin(c: Context<AppEnv>): { id: string; region: RegionConfig } | null {
  const pinned = c.req.header(ORIGIN_OVERRIDE_HEADER);
  if (pinned === undefined) return null;
  allowOverride(c, ORIGIN_OVERRIDE_HEADER, "origin");
  const region = c
    .get("config")
    .regions.find((candidate) => candidate.origins.some((o) => o.id === pinned));
  if (region === undefined) {
    throw invalidRequest(
      `Unknown origin '${clipped(pinned)}' in the ${ORIGIN_OVERRIDE_HEADER} header.`,
      ORIGIN_OVERRIDE_HEADER,
      "invalid_origin",
    );
  }
  return { id: pinned, region };
}

/** The request's route for each model it may be served by, computed once per model. */
export function attemptRoutes(
  c: Context<AppEnv>,
  pinned: string | null,
): (model: string) => AttemptRoute {
  const completion = c.get("completion");
  const user = (completion.body as { user?: unknown }).user;
  const named = c.req.header(SESSION_HEADER) ?? (typeof user === "string" ? user : null);
  const session = named === null || named === "" ? null : named.slice(0, MAX_SESSION_CHARS);
  const byModel = new Map<string, AttemptRoute>();
  return (model) => {
    let route = byModel.get(model);
    if (route === undefined) {
      // An embedding is one prefill with nothing to reuse: no prefix routes it.
      const blocks =
        completion.kind === "embeddings"
          ? []
          : promptBlocks(model, completion.body as PrefixRequest, MAX_ROUTE_BLOCKS);
      route = { blocks, session, pinned };
      byModel.set(model, route);
    }
    return route;
  };
}

/**
 * Refuses a header that picks where a request goes (`x-warmgate-region`,
 * `x-warmgate-origin`) for a key without `allow_region_override`: a caller could otherwise
 * send its traffic to a far or private region or origin.
 */
export function allowOverride(c: Context<AppEnv>, header: string, what: "region" | "origin") {
  if (c.get("admission")?.allowRegionOverride ?? false) return;
  throw new ApiError(
    403,
    `This key may not choose its ${what}: create it with "allow_region_override": true to use the ${header} header.`,
    { type: "permission_error", param: header, code: `${what}_override_not_allowed` },
  );
}
