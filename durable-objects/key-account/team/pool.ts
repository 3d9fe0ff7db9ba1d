/**
 * A key's lease of its team's allowance, as pure functions (docs/key-account.md, "Teams"):
 * what a request lacks of it, what an isolate's lease may take of it, how much to ask for
 * and what to give back. Values in and out, `now` passed in.
 */
import type { TeamAllowance } from "../../team-account/types.ts";

/** What a key's account holds of its team's allowance (a lease, renewed in the background). */
export interface TeamPool {
  teamId: string;
  /** Requests and tokens taken from the team's buckets and not yet used by the key. */
  requests: number;
  tokens: number;
  /**
   * Money the team holds reserved for the key (pico-dollars): covers the key's open
   * reservations, its isolates' leases and what it settled since its last call.
   */
  picos: bigint;
  /** Concurrency slots the team granted: covers the key's requests in flight. */
  slots: number;
  /** Money settled since the last call, reported with the next. */
  settledPicos: bigint;
  /** Whether the team has a budget (money is then checked), and the models it allows. */
  budgeted: boolean;
  models: string[] | null;
  /** The last call's sequence number; `pending`: the call sent and not yet answered. */
  seq: number;
  pending: TeamPendingCall | null;
}

/** A call to the team made and not yet answered: sent again, unchanged, until it is. */
export interface TeamPendingCall {
  seq: number;
  settledPicos: bigint;
  giveBack: TeamAllowance;
  need: TeamAllowance | null;
  want: TeamAllowance;
}

/** What the key uses of the pool's money and slots now. */
export interface PoolUse {
  /** The key's open reservations (ledger rows, isolates' leases, batch holds). */
  reservedPicos: bigint;
  inFlight: number;
}

/** A request's demands on the pool. */
export interface PoolAsk {
  tokens: number;
  picos: bigint;
}

/** What the key used over its last interval, for sizing the next ask. */
export interface PoolRate {
  requests: number;
  tokens: number;
  picos: bigint;
  peakInFlight: number;
}

/** A new pool of `teamId`, holding nothing until its first call. */
export function emptyPool(teamId: string): TeamPool {
  return {
    teamId,
    requests: 0,
    tokens: 0,
    picos: 0n,
    slots: 0,
    settledPicos: 0n,
    budgeted: false,
    models: null,
    seq: 0,
    pending: null,
  };
}

/** Money of the pool the key uses: its reservations and what it settled unreported. */
export function moneyUsed(pool: TeamPool, use: PoolUse): bigint {
  return use.reservedPicos + pool.settledPicos;
}

/** The money the pool lacks to hold `picos` more (zero when it fits or the team has no budget). */
export function moneyShort(pool: TeamPool, picos: bigint, use: PoolUse): bigint {
  const money = pool.budgeted ? moneyUsed(pool, use) + picos - pool.picos : 0n;
  return money > 0n ? money : 0n;
}

/** What the pool lacks for a request (zero in every dimension it covers), or null when it fits. */
export function shortfall(pool: TeamPool, ask: PoolAsk, use: PoolUse): TeamAllowance | null {
  const need: TeamAllowance = {
    requests: Math.max(0, 1 - pool.requests),
    tokens: Math.max(0, ask.tokens - pool.tokens),
    picos: moneyShort(pool, ask.picos, use),
    slots: Math.max(0, use.inFlight + 1 - pool.slots),
  };
  const short = need.requests > 0 || need.tokens > 0 || need.picos > 0n || need.slots > 0;
  return short ? need : null;
}

/** What the pool can still lend an isolate's lease (money null: the team has no budget). */
export function poolHeadroom(
  pool: TeamPool,
  use: PoolUse,
): { requests: number; tokens: number; picos: bigint | null; slots: number } {
  return {
    requests: Math.max(0, pool.requests),
    tokens: Math.max(0, pool.tokens),
    picos: pool.budgeted ? maxBig(0n, pool.picos - moneyUsed(pool, use)) : null,
    slots: Math.max(0, pool.slots - use.inFlight),
  };
}

/**
 * What to ask the team to hold for the key: two intervals of its use, at least a few of its
 * `typical` requests (the last one's tokens and money) and what `waiting` requests lack.
 */
export function wantOf(rate: PoolRate, typical: PoolAsk, waiting: TeamAllowance): TeamAllowance {
  const requests = Math.max(MIN_WANT_REQUESTS, 2 * rate.requests, waiting.requests);
  const tokens =
    rate.requests > 0
      ? Math.ceil((rate.tokens / rate.requests) * requests)
      : typical.tokens * requests;
  const picos =
    rate.requests > 0
      ? (rate.picos * BigInt(requests)) / BigInt(rate.requests)
      : typical.picos * BigInt(requests);
  return {
    requests,
    tokens: Math.max(tokens, waiting.tokens),
    picos: maxBig(picos, waiting.picos),
    slots: Math.max(2, 2 * rate.peakInFlight, waiting.slots),
  };
}

/** What `count` requests lacking `need` each lack together. */
export function times(need: TeamAllowance, count: number): TeamAllowance {
  return {
    requests: need.requests * count,
    tokens: need.tokens * count,
    picos: need.picos * BigInt(count),
    slots: need.slots * count,
  };
}

/** The fewest requests a key asks its team to hold for it. */
export const MIN_WANT_REQUESTS = 4;

/**
 * What to give back of the pool: everything beyond `keep` that the key does not use. A
 * negative token count charges the team for tokens used beyond their reservations.
 */
export function excess(pool: TeamPool, use: PoolUse, keep: TeamAllowance): TeamAllowance {
  const spare = poolHeadroom(pool, use);
  return {
    requests: Math.max(0, spare.requests - keep.requests),
    tokens: pool.tokens < 0 ? pool.tokens : Math.max(0, spare.tokens - keep.tokens),
    picos: spare.picos === null ? 0n : maxBig(0n, spare.picos - keep.picos),
    slots: Math.max(0, spare.slots - keep.slots),
  };
}

/**
 * The models a caller may use: its key's, narrowed by its team's once the team has
 * answered (`termsKnown`) and by its browser token's; null: every model. The one rule of
 * admission, of isolates' leases and of `/v1/models`.
 */
export function usableModels(
  key: readonly string[] | null,
  team: TeamPool | null,
  token: readonly string[] | null,
): string[] | null {
  return allowedModels(allowedModels(key, team?.models ?? null), token);
}

/** Whether the team has answered one of the key's calls yet (its models are then known). */
export function termsKnown(pool: TeamPool): boolean {
  // Each call takes the next number; the pending one is the only unanswered call.
  return pool.seq > (pool.pending === null ? 0 : 1);
}

/** The models both lists allow (null: every model). */
export function allowedModels(
  key: readonly string[] | null,
  team: readonly string[] | null,
): string[] | null {
  if (team === null) return key === null ? null : [...key];
  if (key === null) return [...team];
  return key.filter((model) => team.includes(model));
}

function maxBig(a: bigint, b: bigint): bigint {
  return a > b ? a : b;
}
