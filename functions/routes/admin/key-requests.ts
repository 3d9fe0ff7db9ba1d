/**
 * `GET /admin/keys/{id}/requests/{request_id}`: one request's ledger record (tokens, cost,
 * outcome, every origin tried) read with the admin token, for the dashboard's view of one
 * request; the same record as a key's own `GET /v1/usage/requests/{request_id}`.
 * See docs/api.md.
 */
import { Hono } from "hono";
import type { AppEnv } from "../../app-env.ts";
import { notFound } from "../../../contracts/errors.ts";
import { keyAccount } from "../../accounts/account-client.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import { methodNotAllowed } from "../../error-handler.ts";
import { requestRecordJson } from "../usage.ts";
import { known, noSuchKey } from "./keys.ts";

/** Longest request id echoed in a 404 (an `x-request-id` is far shorter). */
const SHOWN_ID = 64;

/** One request of a key, mounted at `/admin/keys`. */
export const adminKeyRequests = new Hono<AppEnv>()
  .use("/:id/requests/*", adminAuth())
  .get("/:id/requests/:request_id", async (c) => {
    const id = c.req.param("id");
    if (!(await known(c.env, id))) throw noSuchKey(id);
    const requestId = c.req.param("request_id");
    const result = await keyAccount(c.env, id).record({ requestId });
    if (!result.ok || result.record === null) {
      throw notFound(
        `No request with id ${requestId.slice(0, SHOWN_ID)} for key ${id}.`,
        "request_not_found",
        "request_id",
      );
    }
    return c.json(requestRecordJson(result.record));
  })
  .all("/:id/requests/:request_id", methodNotAllowed(["GET", "HEAD"]));
