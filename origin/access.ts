/**
 * Who may call an origin: the edge with its access token on `/v1/*` and `/metrics`,
 * operators with the admin token on `/admin/*` and `/metrics`. An origin that listens
 * beyond loopback must have an access token (see origin/PROTOCOL.md, "Authentication").
 */
import { timingSafeEqual } from "node:crypto";

/** Whether `host` binds only to this machine (127.0.0.0/8, ::1, localhost). */
export function isLoopbackHost(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (bare === "localhost" || bare === "::1") return true;
  return /^127(?:\.\d{1,3}){3}$/.test(bare);
}

/**
 * Why an origin with these settings must not start, or null when it may: one line that
 * says which flag to add.
 */
export function exposureProblem(host: string, accessToken: string | undefined): string | null {
  if (accessToken !== undefined && accessToken !== "") return null;
  if (isLoopbackHost(host)) return null;
  return `--host ${host} listens beyond loopback: add --access-token T (the edge's ORIGIN_TOKEN)`;
}

/** The token `/admin/*` requires: the admin token, else the access token; null on open loopback. */
export function adminTokenOf(options: {
  adminToken?: string;
  accessToken?: string;
}): string | null {
  return options.adminToken ?? options.accessToken ?? null;
}

/**
 * The tokens `GET /metrics` takes: the access token or the admin token; null (open) when
 * `/v1/*` is open too, which only loopback allows.
 */
export function metricsTokensOf(options: {
  adminToken?: string;
  accessToken?: string;
}): string[] | null {
  if (options.accessToken === undefined) return null;
  return options.adminToken === undefined
    ? [options.accessToken]
    : [options.accessToken, options.adminToken];
}

/** Constant-time check of an `Authorization: Bearer …` header against `token`. */
export function bearerMatches(header: string | undefined, token: string): boolean {
  const given = Buffer.from(header ?? "");
  const expected = Buffer.from(`Bearer ${token}`);
  return given.length === expected.length && timingSafeEqual(given, expected);
}
