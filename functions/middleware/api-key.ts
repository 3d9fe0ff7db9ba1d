/**
 * Authenticates `Authorization: Bearer <key>` against the static keys in the
 * `WARMGATE_API_KEYS` secret. Per-key accounts (limits, budgets) replace this later.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../app-env.ts";
import { incorrectApiKey, missingApiKey } from "../errors.ts";

const encoder = new TextEncoder();

let cachedSecret: string | undefined;
let cachedKeys: Uint8Array[] = [];

function staticKeys(secret: string | undefined): Uint8Array[] {
  if (secret !== cachedSecret) {
    cachedSecret = secret;
    cachedKeys = (secret ?? "")
      .split(",")
      .map((key) => key.trim())
      .filter((key) => key !== "")
      .map((key) => encoder.encode(key));
  }
  return cachedKeys;
}

/** The bearer token of an `Authorization` header, or undefined. */
export function bearerToken(header: string | undefined): string | undefined {
  const match = header === undefined ? null : /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

/** Rejects requests without a configured key with OpenAI's 401 `invalid_api_key`. */
export function apiKeyAuth() {
  return createMiddleware<AppEnv>(async function authenticateApiKey(c, next) {
    const token = bearerToken(c.req.header("authorization"));
    if (token === undefined) throw missingApiKey();
    const presented = encoder.encode(token);
    const keys = staticKeys(c.env.WARMGATE_API_KEYS);
    let found = -1;
    keys.forEach((key, index) => {
      // Constant-time comparison, so response timing does not reveal a key's prefix.
      if (
        key.byteLength === presented.byteLength &&
        crypto.subtle.timingSafeEqual(key, presented)
      ) {
        found = index;
      }
    });
    if (found < 0) throw incorrectApiKey();
    c.set("caller", { kind: "static_key", keyId: `static-${found}` });
    await next();
  });
}
