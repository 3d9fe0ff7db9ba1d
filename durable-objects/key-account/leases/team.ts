/**
 * The team's part of an isolate's lease (docs/key-account.md, "Teams"): a member key lends
 * no more than what its lease of its team's allowance has left, and only models its team
 * allows as well. A key without a team lends from its own allowance alone.
 */
import type { AccountStore } from "../store.ts";
import { poolHeadroom } from "../team/pool.ts";
import type { Allowance } from "./sizing.ts";

/** The key's headroom (with its scope's), within what its lease of its team's allowance has left. */
export function withinTeam(store: AccountStore, inFlight: number, key: Allowance): Allowance {
  const pool = store.team.pool;
  if (pool === null) return key;
  const reservedPicos = store.spend.lifetime().reservedPicos;
  const team = poolHeadroom(pool, { reservedPicos, inFlight });
  return {
    requests: Math.min(key.requests, team.requests),
    tokens: Math.min(key.tokens, team.tokens),
    picos: least(key.picos, team.picos),
    slots: Math.min(key.slots, team.slots),
  };
}

// The smaller amount; null is no limit.
function least(a: bigint | null, b: bigint | null): bigint | null {
  return a === null ? b : b === null ? a : a < b ? a : b;
}
