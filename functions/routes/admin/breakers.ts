/**
 * `GET /admin/breakers` and `POST /admin/breakers/:origin`: the origins' circuit breakers,
 * and forcing one open or closed (recorded in the audit log). Behind the admin token.
 * See docs/failover.md, "Breakers".
 */
import { Hono } from "hono";
import { z } from "zod";
import { adminAuth } from "../../middleware/admin-auth.ts";
import type { AppEnv } from "../../app-env.ts";
import { notFound } from "../../../contracts/errors.ts";
import { readJsonBody } from "../../request/json-body.ts";
import { breakerRegion } from "../../health/breakers.ts";
import { keyDirectory } from "../../accounts/account-client.ts";
import { auditEntry } from "../../accounts/audit.ts";
import { methodNotAllowed } from "../../error-handler.ts";

const ForceSchema = z.strictObject({ state: z.enum(["open", "closed"]) });

/** The breaker route group, mounted at `/admin/breakers`. */
export const breakers = new Hono<AppEnv>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    const regions = c.var.config.regions;
    const views = await Promise.all(
      regions.map((region) =>
        c.env.ORIGIN_BREAKERS.getByName(region.id).views(breakerRegion(c.var.config, region)),
      ),
    );
    return c.json({ data: views.flat() });
  })
  .post("/:origin", async (c) => {
    const origin = c.req.param("origin");
    const region = c.var.config.regions.find((r) => r.origins.some((o) => o.id === origin));
    if (region === undefined) {
      throw notFound(`No origin '${origin}' is configured.`, "origin_not_found", "origin");
    }
    const { state } = await readJsonBody(c.req.raw, ForceSchema);
    const at = breakerRegion(c.var.config, region);
    const view = await c.env.ORIGIN_BREAKERS.getByName(region.id).force(at, origin, state);
    // This isolate follows at once; others within their copy's refresh (docs/failover.md).
    await c.get("edge").breakers.cache.refresh(at, Date.now());
    const entry = await auditEntry(c, "breaker.force", { type: "origin", id: origin }, { state });
    await keyDirectory(c.env).log(entry);
    return c.json(view);
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]))
  .all("/:origin", methodNotAllowed(["POST"]));
