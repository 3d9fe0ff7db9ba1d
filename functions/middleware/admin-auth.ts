/**
 * The admin token check in front of every `/admin/*` route and `/metrics`: the bearer token
 * must be `ADMIN_TOKEN`, compared in constant time.
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import { ApiError } from "../../contracts/errors.ts";
import { constantTimeEqual, sha256Hex } from "../../contracts/hashing.ts";
import { bearerToken } from "../accounts/keys.ts";
import { missingSecret } from "../deployment.ts";

/** Refuses any request whose bearer token is not `ADMIN_TOKEN` (compared in constant time). */
export function adminAuth() {
  return createMiddleware<{ Bindings: Env }>(async function adminToken(c, next) {
    const expected = c.env.ADMIN_TOKEN;
    if (expected === undefined || expected === "") throw missingSecret("ADMIN_TOKEN");
    const presented = bearerToken(c.req.header("authorization"));
    // Hashing both sides first makes the comparison independent of the token's length.
    const ok =
      expected !== undefined &&
      expected !== "" &&
      presented !== null &&
      constantTimeEqual(await sha256Hex(presented), await sha256Hex(expected));
    if (!ok) {
      throw new ApiError(401, "Missing or incorrect admin token.", {
        type: "invalid_request_error",
        code: "invalid_admin_token",
      });
    }
    await next();
  });
}
