/**
 * `GET /admin/canaries` and `POST /admin/canaries/:model`: the canary rollouts with both
 * arms' figures, and promoting, pausing, resuming or rolling one back (recorded in the
 * audit log). Behind the admin token.
 * See docs/failover.md, "Canaries".
 */
import { Hono } from "hono";
import { z } from "zod";
import { adminAuth } from "../../middleware/admin-auth.ts";
import type { AppEnv } from "../../app-env.ts";
import { canaryName } from "../../../contracts/canary.ts";
import { notFound } from "../../../contracts/errors.ts";
import { readJsonBody } from "../../request/json-body.ts";
import { keyDirectory } from "../../accounts/account-client.ts";
import { auditEntry } from "../../accounts/audit.ts";
import { methodNotAllowed } from "../../error-handler.ts";

const ActionSchema = z.strictObject({ action: z.enum(["promote", "pause", "resume", "rollback"]) });

/** The canary route group, mounted at `/admin/canaries`. */
export const canaries = new Hono<AppEnv>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    const specs = [...c.var.config.canaries.values()];
    const data = await Promise.all(
      specs.map((spec) => c.env.CANARIES.getByName(canaryName(spec)).view(spec)),
    );
    return c.json({ data });
  })
  .post("/:model", async (c) => {
    const model = c.req.param("model");
    const spec = c.var.config.canaries.get(model);
    if (spec === undefined) {
      throw notFound(
        `No canary is configured for model '${model.slice(0, 128)}'.`,
        "canary_not_found",
        "model",
      );
    }
    const { action } = await readJsonBody(c.req.raw, ActionSchema);
    const view = await c.env.CANARIES.getByName(canaryName(spec)).act(spec, action);
    const entry = await auditEntry(c, `canary.${action}`, { type: "model", id: model });
    await keyDirectory(c.env).log(entry);
    return c.json(view);
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]))
  .all("/:model", methodNotAllowed(["POST"]));
