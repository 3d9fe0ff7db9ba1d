/**
 * Where a key's account asks how its lapsed requests ended (docs/key-account.md, "Leases
 * and reconciliation"): every origin of the configuration, which remember each item they
 * ran (`POST /v1/batch/outcomes`); the lookup and the billing rule are in
 * `contracts/outcomes.ts`, shared with the edge, and what is asked in `lapsed.ts`.
 */
import { ConfigError, type ResolvedConfig, loadConfig } from "../../contracts/config/gateway.ts";
import type { OutcomeSource } from "../../contracts/outcomes.ts";
import type { RequestAttempt } from "./types.ts";

/**
 * The origins of a `WARMGATE_CONFIG` document, resolved as the edge resolves it, each URL
 * once; none when the document is unusable (the edge then admits nothing either).
 */
export function outcomeSources(configText: string | undefined): OutcomeSource[] {
  let config: ResolvedConfig;
  try {
    config = loadConfig(configText);
  } catch (error) {
    if (error instanceof ConfigError) return [];
    throw error;
  }
  const sources = new Map<string, OutcomeSource>();
  for (const region of config.regions) {
    for (const origin of region.origins) {
      sources.set(origin.url, {
        id: origin.id,
        url: origin.url.replace(/\/+$/, ""),
        ...(origin.credentials !== undefined && { credentials: origin.credentials }),
      });
    }
  }
  return [...sources.values()];
}

/**
 * Whether every origin that may hold one of a request's `attempts` answered (`silent`: the
 * ids of those that did not): the ones its edge named, or all when it named none or not
 * all (a lapsed request's edge told none; a Batcher's failure may name no origin).
 */
export function answeredFor(
  attempts: readonly RequestAttempt[],
  silent: ReadonlySet<string>,
): boolean {
  if (attempts.length === 0) return silent.size === 0;
  return attempts.every((a) => (a.origin === null ? silent.size === 0 : !silent.has(a.origin)));
}
