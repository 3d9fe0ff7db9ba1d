/**
 * The key's lease of its team's allowance (table `team_pool`, docs/key-account.md,
 * "Teams"), memory ahead of SQLite and written behind with the rest of the account; and
 * what the key used since its last call to the team, which sizes the next.
 */
import type { WriteBehind } from "../../write-behind.ts";
import type { TeamAllowance } from "../../team-account/types.ts";
import type { PoolAsk, PoolRate, TeamPendingCall, TeamPool } from "../team/pool.ts";

// What the key used is measured over at least this long, so frequent calls do not shrink it.
const RATE_INTERVAL_MS = 1_000;

type StoredPool = Omit<TeamPool, "picos" | "settledPicos" | "pending"> & {
  picos: string;
  settledPicos: string;
  pending:
    | (Omit<TeamPendingCall, "settledPicos" | "giveBack" | "need" | "want"> & {
        settledPicos: string;
        giveBack: StoredAllowance;
        need: StoredAllowance | null;
        want: StoredAllowance;
      })
    | null;
};
type StoredAllowance = Omit<TeamAllowance, "picos"> & { picos: string };

/** The key's team pool, or null when the key has no team. */
export class TeamPoolStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  #pool: TeamPool | null = null;
  #rate: PoolRate = { requests: 0, tokens: 0, picos: 0n, peakInFlight: 0 };
  #rateFrom = 0;
  /** When the key last called its team, and last admitted a request (epoch ms). */
  syncedAt = 0;
  activeAt = 0;
  /** The last admitted request's tokens and money: the size of the next ones, before any rate. */
  typical: PoolAsk = { tokens: 0, picos: 0n };

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** The pool, or null without a team. Changed only through this store's methods. */
  get pool(): TeamPool | null {
    return this.#pool;
  }

  /** What the key used since its last call to the team. */
  get rate(): PoolRate {
    return this.#rate;
  }

  load(): void {
    const row = this.#sql.exec<{ data: string }>("SELECT data FROM team_pool").toArray()[0];
    this.#pool = row === undefined ? null : poolOf(JSON.parse(row.data) as StoredPool | null);
    // A restart counts as activity: what the pool holds is given back once idle again.
    if (this.#pool !== null) this.activeAt = Date.now();
  }

  /** Replaces the pool (null: the key leaves its team). */
  set(pool: TeamPool | null): void {
    this.#pool = pool;
    this.#writes.set("team_pool", () =>
      this.#sql.exec(
        "INSERT OR REPLACE INTO team_pool (singleton, data) VALUES (1, ?)",
        JSON.stringify(pool === null ? null : storedOf(pool)),
      ),
    );
  }

  /** Changes the pool in place and queues its write. */
  change(edit: (pool: TeamPool) => void): void {
    if (this.#pool === null) return;
    edit(this.#pool);
    this.set(this.#pool);
  }

  /** An admission took one request, `tokens` and `picos` with `inFlight` requests in flight. */
  admitted(tokens: number, picos: bigint, inFlight: number, now: number): void {
    this.change((pool) => {
      pool.requests -= 1;
      pool.tokens -= tokens;
    });
    this.#rate = {
      requests: this.#rate.requests + 1,
      tokens: this.#rate.tokens + tokens,
      picos: this.#rate.picos + picos,
      peakInFlight: Math.max(this.#rate.peakInFlight, inFlight),
    };
    this.activeAt = now;
    this.typical = { tokens, picos };
  }

  /** A settlement billed `settledPicos` and gave `tokens` back (negative: charged more). */
  settled(settledPicos: bigint, tokens: number): void {
    if (settledPicos === 0n && tokens === 0) return;
    this.change((pool) => {
      pool.settledPicos += settledPicos;
      pool.tokens += tokens;
    });
  }

  /** Marks a call to the team; what the key used is counted afresh each second at most. */
  resetRate(now: number, inFlight: number): void {
    this.syncedAt = now;
    if (now - this.#rateFrom < RATE_INTERVAL_MS) return;
    this.#rate = { requests: 0, tokens: 0, picos: 0n, peakInFlight: inFlight };
    this.#rateFrom = now;
  }
}

function allowanceOf(stored: StoredAllowance): TeamAllowance {
  return { ...stored, picos: BigInt(stored.picos) };
}

function storedAllowance(allowance: TeamAllowance): StoredAllowance {
  return { ...allowance, picos: `${allowance.picos}` };
}

function poolOf(stored: StoredPool | null): TeamPool | null {
  if (stored === null) return null;
  const { pending } = stored;
  return {
    ...stored,
    picos: BigInt(stored.picos),
    settledPicos: BigInt(stored.settledPicos),
    pending:
      pending === null
        ? null
        : {
            seq: pending.seq,
            settledPicos: BigInt(pending.settledPicos),
            giveBack: allowanceOf(pending.giveBack),
            need: pending.need === null ? null : allowanceOf(pending.need),
            want: allowanceOf(pending.want),
          },
  };
}

function storedOf(pool: TeamPool): StoredPool {
  const { pending } = pool;
  return {
    ...pool,
    picos: `${pool.picos}`,
    settledPicos: `${pool.settledPicos}`,
    pending:
      pending === null
        ? null
        : {
            seq: pending.seq,
            settledPicos: `${pending.settledPicos}`,
            giveBack: storedAllowance(pending.giveBack),
            need: pending.need === null ? null : storedAllowance(pending.need),
            want: storedAllowance(pending.want),
          },
  };
}
