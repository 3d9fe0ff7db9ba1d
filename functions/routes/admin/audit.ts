/**
 * `GET /admin/audit`: the admin audit log, newest first — who (the admin credential's
 * fingerprint, its declared name and address), what (`key.create`, `key.block`, …), on
 * which object, when — a page at a time (`limit`, `before`), filtered by `action` and
 * `target_id`. See docs/key-account.md, "The audit log".
 */
import { Hono } from "hono";
import { keyDirectory } from "../../accounts/account-client.ts";
import { AUDIT_ACTIONS } from "../../accounts/audit.ts";
import { adminAuth } from "../../middleware/admin-auth.ts";
import { invalidRequest } from "../../../contracts/errors.ts";
import { oneOf, onlyParams, whole } from "../query-params.ts";
import { methodNotAllowed } from "../../error-handler.ts";

/** `/admin/audit`, mounted at `/admin/audit`. */
export const audit = new Hono<{ Bindings: Env }>()
  .use("*", adminAuth())
  .get("/", async (c) => {
    const query = c.req.query();
    onlyParams(query, ["limit", "before", "action", "target_id"]);
    const limit = whole(query["limit"] ?? "50", "limit", 1, 500);
    const before = query["before"] === undefined ? null : whole(query["before"], "before", 1);
    const action = oneOf(query, "action", AUDIT_ACTIONS) ?? null;
    const targetId = bounded(query["target_id"], "target_id");
    const page = await keyDirectory(c.env).audit({ limit, before, action, targetId });
    return c.json({
      object: "list",
      data: page.entries.map((entry) => ({
        id: entry.seq,
        object: "audit_entry",
        created_at: Math.floor(entry.at / 1_000),
        actor: entry.actor,
        action: entry.action,
        target: { type: entry.targetType, id: entry.targetId },
        detail: JSON.parse(entry.detail) as unknown,
      })),
      has_more: page.hasMore,
      last_id: page.entries.at(-1)?.seq ?? null,
    });
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]));

function bounded(value: string | undefined, param: string): string | null {
  if (value === undefined) return null;
  if (value.length === 0 || value.length > 200) {
    throw invalidRequest(`${param} must be 1 to 200 characters.`, param, "invalid_value");
  }
  return value;
}
