/**
 * Where a key's account asks how its lapsed requests ended (docs/key-account.md, "Leases
 * and reconciliation"): every origin of the configuration, which remember each item they
 * ran (`POST /v1/batch/outcomes`); the lookup and the billing rule are in
 * `contracts/outcomes.ts`, shared with the edge.
 */
import { ConfigError, type ResolvedConfig, loadConfig } from "../../contracts/config/gateway.ts";
import { type OutcomeSource, lookupOutcomes, reconcile } from "../../contracts/outcomes.ts";
import { MAX_OUTCOME_IDS } from "../../contracts/protocol/schema.ts";
import { settle } from "./settle.ts";
import type { AccountStore } from "./store.ts";

/**
 * Settles the requests whose lease lapsed unsettled (their edge restarted) from what the
 * origins remember, once, as any late settlement of an expired row; those an origin still
 * runs, or that an unanswered origin may know, are asked again later.
 */
export async function reconcileLapsed(store: AccountStore, env: Env, now: number): Promise<void> {
  const ids = store.ledger.lapsedToAsk(now, MAX_OUTCOME_IDS);
  if (ids.length === 0) return;
  const sources = outcomeSources(env.WARMGATE_CONFIG);
  const { items, complete } = await lookupOutcomes(sources, ids, env);
  for (const [requestId, found] of reconcile(ids, items)) {
    if (found.kind === "running" || (found.kind === "unknown" && !complete)) continue;
    store.ledger.resolve(requestId);
    if (found.kind === "unknown") continue;
    // The edge never confirmed delivery: an answer the origin finished counts as cut.
    const outcome = found.outcome === "ok" ? "cancelled" : found.outcome;
    settle(store, { requestId, outcome, usage: found.usage, originBegan: true }, Date.now());
  }
}

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
