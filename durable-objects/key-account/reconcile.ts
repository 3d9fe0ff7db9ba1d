/**
 * Settling requests whose edge went away: a request whose lease lapsed without a
 * settlement (its edge restarted mid-request) is looked up on the origins, which remember
 * how each item ended (`POST /v1/batch/outcomes`, origin/PROTOCOL.md), and billed from
 * that. See docs/key-account.md, "Leases and reconciliation".
 */
import {
  type ItemOutcome,
  type ItemRecord,
  type ItemUsage,
  MAX_OUTCOME_IDS,
  OUTCOMES_PATH,
  type OutcomesResponse,
  requestIdOf,
} from "../../contracts/protocol.ts";
import { credentialRefused, credentialValues } from "../../contracts/credentials.ts";

/** An origin to ask. */
export interface OutcomeSource {
  id: string;
  url: string;
  /** Names of the secrets it takes as bearer tokens, in order (see `contracts/credentials.ts`). */
  credentials?: string[];
}

/** Longest wait for one origin's answer. */
export const OUTCOME_LOOKUP_TIMEOUT_MS = 3_000;

/** What the origins say of one request. */
export type Reconciled =
  /** An item still runs: ask again later. */
  | { kind: "running" }
  /** No origin remembers it: it never reached one, or that origin lost it. */
  | { kind: "unknown" }
  | { kind: "ended"; outcome: ItemOutcome; usage: ItemUsage | null };

/**
 * The origins of a `WARMGATE_CONFIG` document (already validated by the edge at start-up):
 * only their ids and URLs, read defensively.
 */
export function outcomeSources(configText: string | undefined): OutcomeSource[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(configText ?? "");
  } catch {
    return [];
  }
  const regions = (parsed as { regions?: unknown }).regions;
  if (!Array.isArray(regions)) return [];
  const sources = new Map<string, OutcomeSource>();
  for (const region of regions as { origins?: unknown }[]) {
    if (!Array.isArray(region.origins)) continue;
    for (const origin of region.origins as {
      id?: unknown;
      url?: unknown;
      credentials?: unknown;
    }[]) {
      if (typeof origin.id !== "string" || typeof origin.url !== "string") continue;
      const names = Array.isArray(origin.credentials)
        ? origin.credentials.filter((name): name is string => typeof name === "string")
        : undefined;
      sources.set(origin.url, {
        id: origin.id,
        url: origin.url.replace(/\/+$/, ""),
        ...(names !== undefined && { credentials: names }),
      });
    }
  }
  return [...sources.values()];
}

/**
 * How each request ended, by what its items' origins remember. The attempt that finished
 * wins; else the one that generated the most.
 */
export function reconcile(requestIds: readonly string[], items: readonly ItemRecord[]) {
  const byRequest = new Map<string, ItemRecord[]>();
  for (const item of items) {
    const id = requestIdOf(item.id);
    const found = byRequest.get(id);
    if (found === undefined) byRequest.set(id, [item]);
    else found.push(item);
  }
  const result = new Map<string, Reconciled>();
  for (const id of requestIds) {
    const found = byRequest.get(id) ?? [];
    if (found.some((item) => item.state === "running")) {
      result.set(id, { kind: "running" });
      continue;
    }
    let best: Extract<ItemRecord, { state: "ended" }> | null = null;
    for (const item of found) {
      if (item.state !== "ended") continue;
      if (best === null || rank(item) > rank(best)) best = item;
    }
    result.set(
      id,
      best === null
        ? { kind: "unknown" }
        : { kind: "ended", outcome: best.outcome, usage: best.usage },
    );
  }
  return result;
}

function rank(item: Extract<ItemRecord, { state: "ended" }>): number {
  return (item.outcome === "ok" ? 1e12 : 0) + (item.usage?.completion_tokens ?? 0);
}

/**
 * Asks every origin about `requestIds`; `complete` is false when an origin did not answer
 * (then a request none of the others remembers may yet be found there).
 */
export async function lookupOutcomes(
  sources: readonly OutcomeSource[],
  requestIds: readonly string[],
  secrets: object,
): Promise<{ items: ItemRecord[]; complete: boolean }> {
  const ids = requestIds.slice(0, MAX_OUTCOME_IDS);
  if (ids.length < requestIds.length) throw new Error(`at most ${MAX_OUTCOME_IDS} ids a lookup`);
  const answers = await Promise.all(
    sources.map(async (source) => {
      // Each credential in turn, until one is not refused.
      const tokens: (string | undefined)[] = credentialValues(secrets, source.credentials);
      for (const token of tokens.length === 0 ? [undefined] : tokens) {
        try {
          const response = await fetch(`${source.url}${OUTCOMES_PATH}`, {
            method: "POST",
            headers: {
              "content-type": "application/json",
              ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
            },
            body: JSON.stringify({ ids }),
            signal: AbortSignal.timeout(OUTCOME_LOOKUP_TIMEOUT_MS),
          });
          if (response.ok) return (await response.json<OutcomesResponse>()).items;
          await response.body?.cancel();
          if (!credentialRefused(response.status)) return null;
        } catch {
          return null;
        }
      }
      return null;
    }),
  );
  const items: ItemRecord[] = [];
  let complete = true;
  for (const answer of answers) {
    if (answer === null) complete = false;
    else items.push(...answer);
  }
  return { items, complete };
}
