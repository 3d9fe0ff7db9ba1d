/**
 * What the Worker checks when it starts (docs/deploy.md): the configuration parses, the
 * secrets are set, and, unless `WARMGATE_ENV` is `local`, no origin is on an address a
 * Worker cannot reach (loopback, private networks). Outside local runs the first problem
 * is thrown at start-up, so `wrangler deploy` of an unchanged checkout fails with it. An
 * origin on plain HTTP at a public address is warned of.
 */
import { logError, logWarn } from "../contracts/log.ts";
import { configError, type ApiError } from "../contracts/errors.ts";
import { ConfigError, loadConfig } from "../contracts/config/gateway.ts";

/** The bindings these checks read. */
export interface DeploymentEnv {
  WARMGATE_CONFIG?: string;
  WARMGATE_ENV?: string;
  ADMIN_TOKEN?: string;
  TOKEN_SIGNING_SECRET?: string;
}

const LOCAL_HINT =
  "for a local run, copy .dev.vars.example to .dev.vars (wrangler dev reads it) or use npm start";

/** Why a secret is missing, and how to set it, for an error body or a log line. */
export function missingSecret(name: "ADMIN_TOKEN" | "TOKEN_SIGNING_SECRET"): ApiError {
  return configError(
    `The secret ${name} is not set: run \`wrangler secret put ${name}\` for a deployed gateway; ${LOCAL_HINT}.`,
  );
}

function isUnreachableHost(host: string): boolean {
  const name = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (name === "localhost" || name.endsWith(".localhost") || name === "::1" || name === "::") {
    return true;
  }
  if (/^f[cd][0-9a-f]{2}:|^fe[89ab][0-9a-f]:/.test(name)) return true;
  const octets = /^(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(name)?.slice(1).map(Number);
  if (octets === undefined) return false;
  const [a = 0, b = 0] = octets;
  return (
    a === 127 ||
    a === 10 ||
    a === 0 ||
    (a === 172 && b >= 16 && b <= 31) ||
    (a === 192 && b === 168) ||
    (a === 169 && b === 254)
  );
}

/** Everything wrong with a deployment's configuration and secrets, as sentences. */
export function deploymentProblems(env: DeploymentEnv): string[] {
  const problems: string[] = [];
  const local = env.WARMGATE_ENV === "local";
  try {
    const config = loadConfig(env.WARMGATE_CONFIG);
    if (!local) {
      for (const region of config.regions) {
        for (const origin of region.origins) {
          const host = new URL(origin.url).hostname;
          if (isUnreachableHost(host)) {
            problems.push(
              `origin ${origin.id} of region ${region.id} is at ${origin.url}, which a Worker on Cloudflare cannot reach: point WARMGATE_CONFIG at your origins' public (TLS) addresses or a Cloudflare Tunnel (docs/deploy.md); ${LOCAL_HINT}, which sets WARMGATE_ENV=local`,
            );
          }
        }
      }
    }
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    problems.push(...error.problems);
  }
  if (!env.ADMIN_TOKEN) problems.push(missingSecret("ADMIN_TOKEN").message);
  if (!env.TOKEN_SIGNING_SECRET && !env.ADMIN_TOKEN) {
    problems.push(missingSecret("TOKEN_SIGNING_SECRET").message);
  }
  return problems;
}

/**
 * What works but should not be so, as sentences: an origin on plain HTTP at a public
 * address, whose bearer token and prompts would cross the internet in clear.
 */
export function deploymentWarnings(env: DeploymentEnv): string[] {
  let config;
  try {
    config = loadConfig(env.WARMGATE_CONFIG);
  } catch {
    return [];
  }
  const warnings: string[] = [];
  for (const region of config.regions) {
    for (const origin of region.origins) {
      const url = new URL(origin.url);
      if (url.protocol !== "http:" || isUnreachableHost(url.hostname)) continue;
      warnings.push(
        `origin ${origin.id} of region ${region.id} is at ${origin.url}, plain HTTP on a public address: its token (ORIGIN_TOKEN) and every prompt would travel in clear; use https:// or a Cloudflare Tunnel (docs/deploy.md)`,
      );
    }
  }
  return warnings;
}

/**
 * Logs every problem when the Worker starts; outside local runs, throws the configuration's
 * first problem, so the Worker does not start (nor deploy) unable to reach anything.
 * Missing secrets only log: they may be set after the first deploy.
 */
export function checkDeployment(env: DeploymentEnv): void {
  const problems = deploymentProblems(env);
  for (const problem of problems) logError(`warmgate: ${problem}`);
  for (const warning of deploymentWarnings(env)) logWarn(`warmgate: ${warning}`);
  if (env.WARMGATE_ENV === "local") return;
  const fatal = problems.find((p) => !p.startsWith("The secret "));
  if (fatal !== undefined) throw new Error(`warmgate will not start: ${fatal}`);
}
