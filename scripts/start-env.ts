/**
 * What `npm start` prints and writes to its env file: the `export` lines that point a
 * terminal at the running stack, and the hint that sources the file from anywhere.
 * See README.md, "Quick start".
 */
import { resolve } from "node:path";
import type { RunningStack } from "./stack.ts";

/** The variables of the env file, by name. */
export function startVars(stack: RunningStack): Record<string, string> {
  return {
    WARMGATE_URL: stack.edgeUrl,
    // What the openai SDKs read, so their examples run as written.
    OPENAI_BASE_URL: `${stack.edgeUrl}/v1`,
    OPENAI_API_KEY: stack.apiKey,
    WARMGATE_KEY: stack.apiKey,
    WARMGATE_ADMIN_TOKEN: stack.adminToken,
    // What a soft-budget alert's receiver verifies `x-warmgate-signature` with.
    WARMGATE_ALERT_SIGNING_SECRET: stack.alertSigningSecret,
    WARMGATE_ORIGINS: stack.origins.map((o) => o.origin.url).join(","),
    WARMGATE_ORIGIN_ADMIN_TOKEN: stack.originAdminToken,
    // The origins' access token (the edge's ORIGIN_TOKEN), to call an origin directly.
    WARMGATE_ORIGIN_TOKEN: stack.originAccessToken,
  };
}

/** The env file's lines, one `export NAME='value'` a variable. */
export function exportLines(vars: Record<string, string>): string[] {
  return Object.entries(vars).map(([name, value]) => `export ${name}='${value}'`);
}

/** The command that sources the env file, by its absolute path (it works from any folder). */
export function sourceCommand(envFile: string): string {
  return `source ${resolve(envFile)}`;
}
