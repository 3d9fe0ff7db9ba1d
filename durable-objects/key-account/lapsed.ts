/**
 * Settling the requests a key's account lost track of from what the origins remember
 * (docs/key-account.md, "Leases and reconciliation"): each lapsed request asked about by
 * its id, each ended lease's unreported requests by the prefix their ids share, so that an
 * ended lease costs one entry in memory however many ids it could have named.
 */
import { leaseIdPrefix, parseLeasedId } from "../../contracts/lease-ids.ts";
import { type Reconciled, lookupOutcomes, reconcile } from "../../contracts/outcomes.ts";
import {
  MAX_OUTCOME_IDS,
  MAX_OUTCOME_PREFIXES,
  requestIdOf,
} from "../../contracts/protocol/schema.ts";
import { answeredFor, originBook } from "./reconcile.ts";
import { settle } from "./settle.ts";
import type { LedgerEntry } from "./schema.ts";
import type { AccountStore } from "./store.ts";
import type { SettleOutcome } from "./types.ts";

/**
 * Asks the origins about the lapsed requests and ended leases still to look up, and settles
 * each one an origin saw end, once: a request once every origin answered (or one finished
 * it), or at the window's end with what was found; a lease, once no origin runs a request
 * of it (every origin answering).
 */
export async function reconcileLapsed(
  store: AccountStore,
  configText: string | undefined,
  secrets: object,
  now: number,
): Promise<void> {
  const { requestIds, leaseIds, last } = store.ledger.lapsedToAsk(
    now,
    MAX_OUTCOME_IDS,
    MAX_OUTCOME_PREFIXES,
  );
  if (requestIds.length === 0 && leaseIds.length === 0) return;
  const book = originBook(configText);
  const query = { ids: requestIds, prefixes: leaseIds.map(leaseIdPrefix) };
  const { items, complete, silent } = await lookupOutcomes(book.sources, query, secrets);
  for (const [requestId, found] of reconcile(requestIds, items)) {
    const row = store.ledger.committed(requestId);
    // An origin that did not answer may hold an attempt that outranks what the others
    // remember, unless one finished: asked again while the window lasts.
    const finished = found.kind === "ended" && found.outcome === "ok";
    const settled =
      found.kind !== "running" && (answeredFor(row?.attempts ?? [], silent, book) || finished);
    if (!settled && !last.has(requestId)) continue;
    store.ledger.resolve(requestId);
    settleFound(store, requestId, found.kind === "ended" ? found : null, row);
  }
  for (const leaseId of leaseIds) {
    const lease = store.leases.get(leaseId);
    if (lease === undefined) {
      store.ledger.resolveLease(leaseId);
      continue;
    }
    // The lease's requests an origin ran that have no ledger row: within the ids its
    // isolate may have used, under a model of its table.
    const rows = store.leases.rowIds(leaseId);
    const unsettled = new Set<string>();
    for (const item of items) {
      const requestId = requestIdOf(item.id);
      const named = parseLeasedId(requestId);
      if (named?.leaseId !== leaseId || rows.has(requestId)) continue;
      if (named.seq < lease.idsUsed && named.modelIndex < lease.models.length) {
        unsettled.add(requestId);
      }
    }
    let running = false;
    for (const [requestId, found] of reconcile([...unsettled], items)) {
      if (found.kind === "running") running = true;
      else if (found.kind === "ended") settleFound(store, requestId, found, null);
    }
    if (!running && complete) store.ledger.resolveLease(leaseId);
  }
}

// Settles a request from how its origin saw it end (`found`; null: no origin remembers it)
// and its ledger row (`row`; null: none). A request its edge settled without usage ended for
// its client as its row says; any other lapsed with its edge, which never confirmed
// delivery: an answer the origin finished counts as cut, and one no origin remembers stays
// expired at no cost.
function settleFound(
  store: AccountStore,
  requestId: string,
  found: Extract<Reconciled, { kind: "ended" }> | null,
  row: LedgerEntry | null,
): void {
  const told = row?.outcome ?? "expired";
  let outcome: SettleOutcome;
  if (told !== "expired") outcome = told;
  else if (found === null) return;
  else outcome = found.outcome === "ok" ? "cancelled" : found.outcome;
  settle(store, { requestId, outcome, usage: found?.usage ?? null, originBegan: true }, Date.now());
}
