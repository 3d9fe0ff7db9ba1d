/**
 * Billing the requests whose lease lapsed unsettled (docs/key-account.md, "Leases and
 * reconciliation"): asked of the origins (reconcile.ts names them), settled once.
 */
import { lookupOutcomes, reconcile } from "../../contracts/outcomes.ts";
import { MAX_OUTCOME_IDS } from "../../contracts/protocol/schema.ts";
import { outcomeSources } from "./reconcile.ts";
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
