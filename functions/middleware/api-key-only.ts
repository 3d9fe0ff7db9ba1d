/**
 * Routes a browser token may not use (docs/edge.md, "Browser tokens and CORS"): a token acts
 * for one end user within its narrowed limits and models, so the key's own business (its
 * usage, its files and batches, billed to the key past the token's budgets) takes the API key.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import type { Credential } from "../accounts/account-client.ts";
import { ApiError } from "../../contracts/errors.ts";

/** The credential if it is an API key; a browser token is refused (403) from `what`. */
export function apiKeyOnly(
  credential: Credential,
  what: string,
): Extract<Credential, { kind: "key" }> {
  if (credential.kind === "key") return credential;
  throw new ApiError(403, `Browser tokens cannot ${what}; use the API key.`, {
    type: "permission_error",
    code: "permission_denied",
  });
}

/** Refuses a browser token from every route of a group (after `verifyCredential`). */
export function requireApiKey(what: string) {
  return createMiddleware<AppEnv>(async function refuseBrowserTokens(c, next) {
    apiKeyOnly(c.get("credential"), what);
    await next();
  });
}
