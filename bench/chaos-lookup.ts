/**
 * What the chaos trial asks after its traffic (docs/benchmarks.md, "Chaos"): each request's
 * ledger record by id, an end user's closed rows, a key's rollups, what the origins remember
 * of each request (`POST /v1/batch/outcomes`), and how many of a key's slots are free.
 */
import {
  type ItemRecord,
  MAX_OUTCOME_IDS,
  OUTCOMES_PATH,
  OutcomesResponseSchema,
  requestIdOf,
} from "../contracts/protocol/schema.ts";
import type { LedgerEntry, UserRows } from "./chaos-ledger.ts";

/** Lookups in flight at once: the edge being measured stays up for them. */
const LOOKUPS_AT_ONCE = 8;

// Pico-dollars from a cost in USD: the double nearest an exact pico-dollar amount, which
// for the cents a trial costs scales back to that amount.
const picos = (usd: number): bigint => BigInt(Math.round(usd * 1e12));

async function eachFew<T, R>(list: readonly T[], read: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < list.length; i += LOOKUPS_AT_ONCE) {
    out.push(...(await Promise.all(list.slice(i, i + LOOKUPS_AT_ONCE).map(read))));
  }
  return out;
}

type RecordJson = {
  status: LedgerEntry["status"];
  outcome: string | null;
  model: string;
  completion_tokens: number | null;
  cost_usd: number;
  attempts?: { origin: string | null }[];
};

/** Each request's ledger record by id (null where the ledger has none). */
export async function readRecords(
  edgeUrl: string,
  key: string,
  ids: readonly string[],
): Promise<Map<string, LedgerEntry | null>> {
  const found = await eachFew(ids, async (id) => {
    const res = await fetch(`${edgeUrl}/v1/usage/requests/${id}`, {
      headers: { authorization: `Bearer ${key}` },
    });
    if (res.status === 404) {
      await res.arrayBuffer();
      return null;
    }
    if (res.status !== 200) throw new Error(`reading ${id}: ${res.status}`);
    const r = (await res.json()) as RecordJson;
    return {
      status: r.status,
      outcome: r.outcome,
      model: r.model,
      origins: (r.attempts ?? []).map((a) => a.origin),
      completionTokens: r.completion_tokens,
      costPicos: picos(r.cost_usd),
    } satisfies LedgerEntry;
  });
  return new Map(ids.map((id, i) => [id, found[i] ?? null]));
}

/** The UTC days a trial spans, as `GET /v1/usage` takes them. */
export interface DayRange {
  from: string;
  to: string;
}

/** A key's totals over `range`, or one end user's closed rows when `user` is given. */
export async function usageTotals(
  edgeUrl: string,
  key: string,
  range: DayRange,
  user?: string,
): Promise<UserRows> {
  const query = new URLSearchParams({ ...range, ...(user === undefined ? {} : { user }) });
  const res = await fetch(`${edgeUrl}/v1/usage?${query}`, {
    headers: { authorization: `Bearer ${key}` },
  });
  if (res.status !== 200) throw new Error(`reading usage: ${res.status}`);
  const { total } = (await res.json()) as { total: { requests: number; cost_usd: number } };
  return { requests: total.requests, costPicos: picos(total.cost_usd) };
}

/** Each end user's closed rows. */
export async function readUserRows(
  edgeUrl: string,
  key: string,
  range: DayRange,
  users: readonly string[],
): Promise<Map<string, UserRows>> {
  const rows = await eachFew(users, (user) => usageTotals(edgeUrl, key, range, user));
  return new Map(users.map((user, i) => [user, rows[i] ?? { requests: 0, costPicos: 0n }]));
}

/** An origin to ask, and the token it takes. */
export interface OriginAccess {
  id: string;
  url: string;
  token: string;
}

/** An item an origin remembers, and which origin. */
export type OriginItem = ItemRecord & { origin: string };

/**
 * What every origin remembers of each request, its attempts included; null when an origin
 * did not answer (then nothing can be said of any of them).
 */
export async function readOriginItems(
  origins: readonly OriginAccess[],
  ids: readonly string[],
): Promise<Map<string, OriginItem[]> | null> {
  const byRequest = new Map<string, OriginItem[]>(ids.map((id) => [id, []]));
  for (const origin of origins) {
    for (let i = 0; i < ids.length; i += MAX_OUTCOME_IDS) {
      const res = await fetch(`${origin.url}${OUTCOMES_PATH}`, {
        method: "POST",
        headers: { authorization: `Bearer ${origin.token}`, "content-type": "application/json" },
        body: JSON.stringify({ ids: ids.slice(i, i + MAX_OUTCOME_IDS) }),
      }).catch(() => null);
      if (res?.status !== 200) {
        await res?.arrayBuffer();
        return null;
      }
      for (const item of OutcomesResponseSchema.parse(await res.json()).items) {
        byRequest.get(requestIdOf(item.id))?.push({ ...item, origin: origin.id });
      }
    }
  }
  return byRequest;
}

/**
 * Holds `n` streams at once on `key` and counts those refused for the key's concurrent
 * requests: slots still held by requests that ended. The streams are then cancelled.
 */
export async function refusedSlots(
  edgeUrl: string,
  key: string,
  n: number,
  user: string,
): Promise<number> {
  const aborts = Array.from({ length: n }, () => new AbortController());
  const refused = await Promise.all(
    aborts.map(async (abort) => {
      const res = await fetch(`${edgeUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "warmgate-sim-8b",
          messages: [{ role: "user", content: "Hold a slot." }],
          max_tokens: 2_000,
          ignore_eos: true,
          stream: true,
          user,
        }),
        signal: abort.signal,
      }).catch(() => null);
      if (res?.status !== 429) return false;
      const body = (await res.json()) as { error?: { message?: string } };
      return body.error?.message?.includes("concurrent requests") === true;
    }),
  );
  for (const abort of aborts) abort.abort();
  return refused.filter(Boolean).length;
}
