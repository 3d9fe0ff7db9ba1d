/**
 * TeamAccount: one Durable Object per team (named by the team id) holding its record,
 * its buckets, its settled spend, what each member key's account holds of its allowance
 * and its soft-budget alerts. It is never on a request's path: member keys lease from it in
 * the background, and only a request that its key's lease cannot hold waits for it.
 * docs/key-account.md, "Teams".
 */
import { DurableObject } from "cloudflare:workers";
import { applyMigrations } from "../migrations.ts";
import { adjust } from "../key-account/token-bucket.ts";
import { hourOf } from "../../contracts/budget-periods.ts";
import { budgetStatuses, hasBudgets } from "../key-account/budgets.ts";
import {
  alertSettings,
  deliverAlerts,
  raiseCrossings,
  softBudgets,
} from "../key-account/alerts.ts";
import { TeamAlerts } from "./alerts.ts";
import { NONE, decideGrant, heldInTheWay } from "./grants.ts";
import { logWarn } from "../../contracts/log.ts";
import { TEAM_ACCOUNT_MIGRATIONS, TeamStore } from "./store.ts";
import type {
  TeamCreateInput,
  TeamLeaseAnswer,
  TeamLeaseCall,
  TeamMetrics,
  TeamRecord,
  TeamUpdateInput,
  TeamView,
} from "./types.ts";

// A refusal asks at most this many other member keys to give back, and waits this long.
const RECALL_MAX_KEYS = 32;
const RECALL_WAIT_MS = 1_000;

/** Limits, budgets and spend of one team, leased to its member keys' accounts. */
export class TeamAccount extends DurableObject<Env> {
  readonly #store: TeamStore;
  #alerts: TeamAlerts;
  // The recall round under way, and the keys that last had nothing spare (at which call).
  #recalling: Promise<void> | null = null;
  readonly #dry = new Map<string, number>();

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.#store = new TeamStore(ctx.storage);
    this.#alerts = new TeamAlerts(ctx.storage);
    void ctx.blockConcurrencyWhile(async () => {
      applyMigrations(ctx.storage, TEAM_ACCOUNT_MIGRATIONS);
      this.#store.load();
      this.#alerts.load();
    });
  }

  /** Creates the team; null when this object already holds one. */
  create(input: TeamCreateInput): TeamRecord | null {
    return this.#store.create(input) ? this.#store.record : null;
  }

  /** The team record, or null when no team lives here. */
  get(): TeamRecord | null {
    return this.#store.record;
  }

  /** Applies a partial change; null when no team lives here. Keys learn it at their next lease call. */
  update(input: TeamUpdateInput): TeamRecord | null {
    return this.#store.update(input);
  }

  /** The record with the spend of each budget period and the slots leased out. */
  view(now?: number): TeamView | null {
    const record = this.#store.record;
    if (record === null) return null;
    return {
      record,
      slotsHeld: this.#store.slotsHeld(),
      budgets: budgetStatuses(this.#store.lines(record.budgets, now ?? Date.now())),
    };
  }

  /** Deletes the team and all it holds (the admin API first checks that it has no keys). */
  async remove(): Promise<void> {
    await this.ctx.storage.deleteAll();
    applyMigrations(this.ctx.storage, TEAM_ACCOUNT_MIGRATIONS);
    this.#store.load();
    this.#alerts = new TeamAlerts(this.ctx.storage);
  }

  /** The team's alert counts, for `/metrics`. */
  metrics(): TeamMetrics {
    return { teamId: this.#store.record?.id ?? "", budgetAlerts: this.#alerts.counts() };
  }

  /** Delivers the alerts due (signed, retried: key-account/alerts.ts); safe to run twice. */
  override async alarm(): Promise<void> {
    const now = Date.now();
    const settings = alertSettings(this.env.WARMGATE_CONFIG);
    await deliverAlerts(this.#alerts, now, settings, this.env.ALERT_SIGNING_SECRET);
    this.#alerts.alerts.prune(now);
    const next = this.#alerts.alerts.nextDue();
    if (Number.isFinite(next)) await this.ctx.storage.setAlarm(next);
  }

  /**
   * A member key's lease call: applies what it settled and gives back, then grants all it
   * needs (or refuses, naming the team limit) and a share of headroom towards what it
   * wants. A need refused for money or slots other keys hold first asks them to give back
   * what they do not use, then is decided again. Committed before it answers; a repeated
   * call is answered as the first time. Spend that takes a window to its soft limit raises
   * the team's alert.
   */
  async lease(call: TeamLeaseCall): Promise<TeamLeaseAnswer> {
    const now = call.now ?? Date.now();
    const record = this.#store.record;
    if (record === null) return { seq: call.seq, granted: NONE, refusal: null, terms: null };
    const terms = { models: record.models, budgeted: hasBudgets(record.budgets) };
    const repeat = this.#repeatOf(call, terms);
    if (repeat !== null) return repeat;
    let decided = this.#decide(call, record, now);
    const held = heldInTheWay(decided.outcome.refusal);
    if (held !== null) {
      await this.#recall(held, call.keyId);
      // The same call sent again while this one waited may have been answered meanwhile.
      const answered = this.#repeatOf(call, terms);
      if (answered !== null) return answered;
      const current = this.#store.record;
      if (current === null) return { seq: call.seq, granted: NONE, refusal: null, terms: null };
      decided = this.#decide(call, current, now);
    }
    const { outcome, kept } = decided;
    const { granted } = outcome;
    this.#store.commitLease({
      keyId: call.keyId,
      member: {
        picos: kept.picos + granted.picos,
        slots: kept.slots + granted.slots,
        seq: call.seq,
        granted,
      },
      buckets: outcome.buckets,
      settled: { hour: hourOf(now), picos: call.settledPicos },
    });
    if (call.settledPicos > 0n) await this.#raiseAlerts(record, now);
    return { seq: call.seq, granted, refusal: outcome.refusal, terms };
  }

  // The answer to a call already answered (its grant again), or null for a new one.
  #repeatOf(call: TeamLeaseCall, terms: TeamLeaseAnswer["terms"]): TeamLeaseAnswer | null {
    const member = this.#store.member(call.keyId);
    if (call.seq > member.seq) return null;
    const granted = call.seq === member.seq ? member.granted : NONE;
    return { seq: call.seq, granted, refusal: null, terms };
  }

  // The grant for `call` as the team stands now, once what the key settled and gives back is applied.
  #decide(call: TeamLeaseCall, record: TeamRecord, now: number) {
    const member = this.#store.member(call.keyId);
    const { limits, budgets } = record;
    const back = call.giveBack;
    const left = member.picos - call.settledPicos - back.picos;
    const kept = { picos: left > 0n ? left : 0n, slots: Math.max(0, member.slots - back.slots) };
    const moved = kept.picos - member.picos;
    const lines = this.#store.lines(budgets, now).map((line) => ({
      ...line,
      spend: {
        settledPicos: line.spend.settledPicos + call.settledPicos,
        reservedPicos: line.spend.reservedPicos + moved,
      },
    }));
    const outcome = decideGrant({
      limits,
      lines,
      buckets: {
        requests: adjust(
          this.#store.bucket("requests", limits.rpm, now),
          limits.rpm,
          back.requests,
          now,
        ),
        tokens: adjust(this.#store.bucket("tokens", limits.tpm, now), limits.tpm, back.tokens, now),
      },
      slotsHeld: this.#store.slotsHeld() - member.slots + kept.slots,
      need: call.need,
      want: call.want,
      now,
    });
    return { outcome, kept };
  }

  // Asks the member keys but `except` holding `held` to give back the money and slots they
  // do not use, waiting at most RECALL_WAIT_MS. One round at a time: a round under way is
  // waited for first. A key that had nothing spare is asked again only after its next
  // call (its holdings change only with its calls, or its requests' ends, which it reports
  // within a second while busy and in full once idle).
  async #recall(held: "picos" | "slots", except: string): Promise<void> {
    const deadline = Date.now() + RECALL_WAIT_MS;
    while (this.#recalling !== null) {
      if (!(await within(this.#recalling, deadline))) return;
    }
    const keyIds = this.#store
      .holders(held, except)
      .filter((keyId) => this.#dry.get(keyId) !== this.#store.member(keyId).seq)
      .slice(0, RECALL_MAX_KEYS);
    if (keyIds.length === 0) return;
    const asks = keyIds.map(async (keyId) => {
      const seq = this.#store.member(keyId).seq;
      try {
        const gave = await this.env.KEY_ACCOUNT.getByName(keyId).recallTeamLease();
        if (gave) this.#dry.delete(keyId);
        else this.#dry.set(keyId, seq);
      } catch (error) {
        logWarn("team recall failed", { key_id: keyId, error });
      }
    });
    // Each ask catches its own failure: the round always settles, and then ends.
    const round = Promise.all(asks).then(() => {
      this.#recalling = null;
    });
    this.#recalling = round;
    await within(round, deadline);
  }

  // Soft limits the settled spend took their window to raise an alert each, sent by the alarm.
  async #raiseAlerts(record: TeamRecord, now: number): Promise<void> {
    const soft = softBudgets(record.budgets);
    if (soft.periods.length === 0) return;
    const owner = {
      scope: "team",
      names: { team_id: record.id, team_name: record.name },
      url: record.alertWebhookUrl ?? alertSettings(this.env.WARMGATE_CONFIG).webhookUrl,
    };
    const raised = raiseCrossings(this.#alerts, owner, this.#store.lines(soft, now), now);
    this.#alerts.flush();
    if (raised) await this.ctx.storage.setAlarm(now);
  }
}

// Waits for `promise` until `deadline` (epoch ms); whether it settled by then.
async function within(promise: Promise<void>, deadline: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), Math.max(0, deadline - Date.now()));
  });
  try {
    return await Promise.race([promise.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}
