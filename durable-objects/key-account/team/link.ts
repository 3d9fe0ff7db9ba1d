/**
 * The key account's calls to its team's `TeamAccount` (docs/key-account.md, "Teams"): in
 * the background to top its lease up, report what it settled and give back what it does not
 * use; and on a request's path only when the lease cannot hold it. One call at a time; a
 * call is written before it is sent and sent again unchanged until answered.
 */
import { logWarn } from "../../../contracts/log.ts";
import type { TeamAccount } from "../../team-account/index.ts";
import type { TeamAllowance, TeamRefusal } from "../../team-account/types.ts";
import type { AccountStore } from "../store.ts";
import { KEY_SCOPE } from "../schema.ts";
import {
  type PoolAsk,
  type PoolUse,
  type TeamPool,
  excess,
  poolHeadroom,
  times,
  wantOf,
  emptyPool,
  termsKnown,
} from "./pool.ts";

/** A key idle this long gives back what it holds of its team's allowance unused. */
export const TEAM_IDLE_MS = 5_000;
/** How often a busy key reports its settled spend to its team at most. */
export const TEAM_REPORT_MS = 1_000;

const NOTHING: TeamAllowance = { requests: 0, tokens: 0, picos: 0n, slots: 0 };

/**
 * Why the key calls its team: top up (`renew`), give back all unused (`idle`), give back
 * the money and slots unused that another key needs (`recall`), or leave.
 */
type CallMode = "renew" | "idle" | "recall" | "leave";

/** A key account's side of its team lease. */
export class TeamLink {
  readonly #store: AccountStore;
  readonly #teams: DurableObjectNamespace<TeamAccount>;
  #running: Promise<unknown> | null = null;
  // Requests of the key waiting for the team now, each lacking about what the first does.
  #waiting = 0;
  // Whether the call under way carries a request's need (the team may then wait on a recall).
  #runningNeeds = false;

  constructor(store: AccountStore, teams: DurableObjectNamespace<TeamAccount>) {
    this.#store = store;
    this.#teams = teams;
  }

  /**
   * Asks the team for what a request lacks (`need`) and a top-up; answers the team's
   * refusal, or null once the call is over (the request is then decided again). A call
   * already under way is waited for instead.
   */
  async obtain(need: TeamAllowance, ask: PoolAsk): Promise<TeamRefusal | null> {
    this.#waiting++;
    // Sizes the call (wantOf) when the key has no rate yet.
    this.#store.team.typical = ask;
    try {
      if (this.#running !== null) {
        await this.#running;
        return null;
      }
      return await this.#call(need, "renew");
    } finally {
      this.#waiting--;
    }
  }

  /**
   * Starts a call when the lease runs low or has spend to report, and answers it (the
   * caller lets it run in the background); null when none is due.
   */
  keepUp(now: number): Promise<unknown> | null {
    const pool = this.#store.team.pool;
    if (pool === null || this.#running !== null) return null;
    return pool.pending !== null || this.#due(pool, now) ? this.#call(null, "renew") : null;
  }

  /** When the alarm should run for an idle key's lease (a second from `now` at the soonest). */
  alarmAt(now: number): number | null {
    const idle = this.idleAt();
    return idle === null ? null : Math.max(idle, now + 1_000);
  }

  /**
   * When an idle key should give back what it holds unused, or null: 5 s after its last
   * admission or call to the team, whichever is later (a grant no request used, such as
   * the first call's for the key's models, is given back too; a call unanswered is sent again).
   */
  idleAt(): number | null {
    const team = this.#store.team;
    const last = Math.max(team.activeAt, team.syncedAt);
    if (team.pool === null || last === 0) return null;
    const spare = poolHeadroom(team.pool, this.#use());
    const holds = spare.requests > 0 || spare.slots > 0 || (spare.picos ?? 0n) > 0n;
    const owes = team.pool.settledPicos > 0n || team.pool.pending !== null;
    return holds || owes ? last + TEAM_IDLE_MS : null;
  }

  /**
   * The team asks for the money and slots the key holds unused (another key needs them):
   * given back now, or after a background call under way (the team answers those without
   * waiting). A request's call under way already gave back the money the key held unused,
   * and may be waiting on this recall at the team: nothing then. Whether the key gave any.
   */
  async recall(): Promise<boolean> {
    while (this.#running !== null && !this.#runningNeeds) await this.#running;
    const pending = this.#store.team.pool?.pending ?? null;
    const needs = (pending?.need ?? null) !== null;
    if (this.#running !== null || needs || !this.#holdsSpare()) return false;
    await this.#call(null, "recall");
    return true;
  }

  // Whether the key holds money or slots of its team that it does not use now.
  #holdsSpare(): boolean {
    const pool = this.#store.team.pool;
    if (pool === null) return false;
    const spare = poolHeadroom(pool, this.#use());
    return spare.slots > 0 || (spare.picos ?? 0n) > 0n;
  }

  /** Makes sure the team has answered the key once, so its models are known. */
  async learnTerms(): Promise<void> {
    const pool = this.#store.team.pool;
    if (pool === null || termsKnown(pool)) return;
    if (this.#running !== null) await this.#running;
    else await this.#call(null, "renew");
  }

  /** Reports what the key settled to its team now, after any call under way. */
  async report(): Promise<void> {
    while (this.#running !== null) await this.#running;
    if ((this.#store.team.pool?.settledPicos ?? 0n) > 0n) await this.#call(null, "renew");
  }

  /** At the alarm: gives back all that an idle key holds unused, and reports its spend. */
  async release(now: number): Promise<void> {
    const at = this.idleAt();
    if (at !== null && at <= now && this.#running === null) await this.#call(null, "idle");
  }

  /** The key (created, or moved) is now in `teamId` (null: none), holding nothing of it yet. */
  join(teamId: string | null): void {
    this.#store.team.set(teamId === null ? null : emptyPool(teamId));
    this.#store.flush();
  }

  /** Leaves the key's team when a change names another (`undefined`: no change); whether it did. */
  async leaveFor(teamId: string | null | undefined): Promise<boolean> {
    if (teamId === undefined || teamId === (this.#store.key.record?.teamId ?? null)) return false;
    await this.leave();
    return true;
  }

  /** Gives everything back to the team and leaves it (the key moves or is revoked). */
  async leave(): Promise<void> {
    while (this.#running !== null) await this.#running;
    if (this.#store.team.pool !== null) await this.#call(null, "leave");
    this.#store.team.set(null);
  }

  #use(): PoolUse {
    return {
      reservedPicos: this.#store.spend.lifetime().reservedPicos,
      inFlight: this.#store.scopeUsage(KEY_SCOPE, null).inFlight,
    };
  }

  #due(pool: TeamPool, now: number): boolean {
    const sinceLast = now - this.#store.team.syncedAt;
    if (pool.settledPicos > 0n && sinceLast >= TEAM_REPORT_MS) return true;
    const want = wantOf(this.#store.team.rate, this.#store.team.typical, NOTHING);
    const spare = poolHeadroom(pool, this.#use());
    return (
      spare.requests * 2 < want.requests ||
      spare.tokens * 2 < want.tokens ||
      spare.slots * 2 < want.slots ||
      (spare.picos !== null && spare.picos * 2n < want.picos)
    );
  }

  #call(need: TeamAllowance | null, mode: CallMode): Promise<TeamRefusal | null> {
    // A call sent again carries the need it was first sent with.
    const pending = this.#store.team.pool?.pending ?? null;
    this.#runningNeeds = (pending === null ? need : pending.need) !== null;
    const running = this.#send(need, mode).finally(() => {
      this.#running = null;
    });
    this.#running = running;
    return running;
  }

  async #send(need: TeamAllowance | null, mode: CallMode): Promise<TeamRefusal | null> {
    const team = this.#store.team;
    const pool = team.pool;
    const keyId = this.#store.key.record?.id;
    if (pool === null || keyId === undefined) return null;
    const now = Date.now();
    if (pool.pending === null) {
      const use = this.#use();
      // A request short of money gives back all the money the key holds unused and asks
      // for its whole worst case: the team weighs the request itself, so its refusal says
      // whether a retry can help.
      const spare = need !== null && need.picos > 0n ? (poolHeadroom(pool, use).picos ?? 0n) : 0n;
      const asked = need === null ? null : { ...need, picos: need.picos + spare };
      const waiting = asked === null ? NOTHING : times(asked, this.#waiting);
      const want = mode === "renew" ? wantOf(team.rate, team.typical, waiting) : NOTHING;
      const giveBack =
        mode === "leave"
          ? {
              requests: pool.requests,
              tokens: pool.tokens,
              picos: pool.picos - pool.settledPicos,
              slots: pool.slots,
            }
          : excess(pool, use, mode === "recall" ? keepRates(pool) : want);
      if (spare > 0n) giveBack.picos = spare;
      const pending = {
        seq: pool.seq + 1,
        settledPicos: pool.settledPicos,
        giveBack,
        need: asked,
        want,
      };
      team.change((held) => {
        held.pending = pending;
        held.seq = pending.seq;
        held.settledPicos = 0n;
        held.picos -= pending.settledPicos + giveBack.picos;
        held.requests -= giveBack.requests;
        held.tokens -= giveBack.tokens;
        held.slots -= giveBack.slots;
      });
      team.resetRate(now, use.inFlight);
    }
    // Written before it leaves: a restart sends it again rather than forget what it gave back.
    this.#store.flush();
    const call = team.pool?.pending;
    if (call === null || call === undefined) return null;
    const stub = this.#teams.get(this.#teams.idFromName(pool.teamId));
    try {
      const answer = await stub.lease({ keyId, ...call, now });
      team.change((held) => {
        if (held.pending?.seq !== answer.seq) return;
        held.pending = null;
        held.requests += answer.granted.requests;
        held.tokens += answer.granted.tokens;
        held.picos += answer.granted.picos;
        held.slots += answer.granted.slots;
        held.budgeted = answer.terms?.budgeted ?? false;
        held.models = answer.terms?.models ?? null;
      });
      const refusal = answer.refusal;
      return refusal === null ? null : { ...refusal, teamId: pool.teamId };
    } catch (error) {
      logWarn("team lease call failed", { key_id: keyId, team_id: pool.teamId, error });
      return null;
    }
  }
}

// What a recalled key keeps: the requests and tokens it took from the team's buckets.
function keepRates(pool: TeamPool): TeamAllowance {
  return { requests: pool.requests, tokens: Math.max(0, pool.tokens), picos: 0n, slots: 0 };
}
