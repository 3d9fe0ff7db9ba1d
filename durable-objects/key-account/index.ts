/**
 * KeyAccount: one Durable Object per API key (named by the key id) holding its record,
 * secrets, rate-limit buckets, budgets and ledger in SQLite; it answers `admit` and
 * `settle` for the request path in one call each, decides from memory and writes behind.
 * Storage, invariants and commit stamps: docs/key-account.md.
 */
import { LEDGER_RETENTION_MS } from "./types.ts";
import { DurableObject } from "cloudflare:workers";
import { applyMigrations } from "../migrations.ts";
import { admitWithTeam, clampLease } from "./admit.ts";
import { reconcileLapsed } from "./lapsed.ts";
import { TeamLink } from "./team/link.ts";
import { KEY_ACCOUNT_MIGRATIONS } from "./migrations.ts";
import { budgetStatusOf, checkKey, recordOf, requestsOf, usageOf } from "./reads.ts";
import {
  type BatchCharge,
  type BatchChargeResult,
  type BatchHoldInput,
  type BatchHoldResult,
  chargeBatch,
  holdBatch,
  releaseBatch,
} from "./batch-holds.ts";
import { RECONCILE_FIRST_ASK_MS, expireDue, settle } from "./settle.ts";
import {
  answerLeaseCall,
  endDueLeases,
  giveBack,
  grantLease,
  restoreLapsed,
} from "./leases/grant.ts";
import { ownLeaseAsk } from "./leases/scope.ts";
import { leaseHolder } from "../../contracts/lease-scopes.ts";
import type { LeaseAnswer, LeaseAsk, LeaseCall, LeaseHeld } from "./leases/types.ts";
import type { KeyMetrics } from "./metrics.ts";
import { AccountStore } from "./store.ts";
import { alertSettings, deliverAlerts, keyBook, raiseAlerts } from "./alerts.ts";
import {
  type AdmitAnswer,
  type AdmitInput,
  type CheckCredential,
  type KeyCheckResult,
  type KeyCreateInput,
  type KeyRecord,
  type KeyUpdateInput,
  type SettleInput,
  type SettleManyResult,
  type SettleResult,
} from "./types.ts";
import { type BudgetStatus } from "./budget-types.ts";
import {
  type RecordResult,
  type LedgerRecord,
  type RequestLogQuery,
  type UsageQuery,
  type UsageResult,
} from "./usage-types.ts";

// Pruning runs at most this often, so steady traffic does not turn into an alarm per request.
const PRUNE_INTERVAL_MS = 60_000;
// How often the origins are asked again about a lapsed request while one still runs it.
const RECONCILE_RETRY_MS = 5_000;

/** Limits, counters and reservations of one API key. */
export class KeyAccount extends DurableObject<Env> {
  readonly #store: AccountStore;
  readonly #team: TeamLink;
  #alarmAt: number | null = null;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    // Memory ahead of storage for good would bill from state that is gone: start again.
    this.#store = new AccountStore(ctx.storage, () => ctx.abort("key account commit failed"));
    this.#team = new TeamLink(this.#store, env.TEAM_ACCOUNT);
    void ctx.blockConcurrencyWhile(() => this.#migrate());
  }

  /** Creates the key; null when this object already holds one. */
  create(input: KeyCreateInput): KeyRecord | null {
    const record = this.#store.key.create(input);
    if (record !== null) this.#team.join(record.teamId);
    return record;
  }

  /** The key record, or null when no key lives here. */
  get(now?: number): KeyRecord | null {
    return this.#store.key.view(now ?? Date.now());
  }

  /** Applies a partial change (a new team: the old one gets back all it lent); null without a key. */
  async update(input: KeyUpdateInput): Promise<KeyRecord | null> {
    const moves = await this.#team.leaveFor(input.teamId);
    const record = this.#store.key.update(input);
    if (moves && record !== null) this.#team.join(record.teamId);
    return record;
  }

  /** Revokes the key: its very next request is refused; its team gets back what it lent. */
  async revoke(now: number): Promise<KeyRecord | null> {
    const record = this.#store.key.revoke(now);
    if (record !== null) await this.#team.leave();
    return record;
  }

  /** Gives back to the key's team all it holds unused (another key needs it); whether any. */
  recallTeamLease(): Promise<boolean> {
    return this.#team.recall();
  }

  /**
   * Makes `secretHash` the current secret; the previous one stays valid for `graceMs`.
   * Null when no key lives here or the key is revoked.
   */
  rotate(input: { secretHash: string; graceMs: number; now: number }): KeyRecord | null {
    return this.#store.key.rotate(input);
  }

  /**
   * Checks a credential without admitting a request (nothing is reserved or counted), with
   * the models the caller may use; a key whose team never answered it asks the team first.
   */
  async check(input: {
    credential: CheckCredential;
    origin?: string | null;
    models?: string[] | null;
    now?: number;
  }): Promise<KeyCheckResult> {
    if (checkKey(this.#store, input).ok) {
      await this.#team.learnTerms();
      await this.#teamIdleAlarm();
    }
    return checkKey(this.#store, input);
  }

  /**
   * Admits or refuses one request atomically: secret, status, origin, models, concurrency,
   * requests, tokens and budgets; on admission reserves a concurrency slot, the tokens and
   * the worst-case cost, and opens the request's ledger row. Decided from memory; an
   * admission's writes (and those of the settlements it carries) commit before it is
   * answered, a refusal's behind, in `commit.pending`.
   */
  async admit(input: AdmitInput & { lease?: LeaseAsk }): Promise<AdmitAnswer & LeaseHeld> {
    const now = Date.now();
    const settled = (input.settle ?? []).map((one) => settle(this.#store, one, one.now ?? now));
    // The isolate gives back its lease's unused part first (docs/key-account.md).
    const hash = leaseHolder(input.credential);
    const ask = ownLeaseAsk(input);
    endDueLeases(this.#store, now);
    if (ask !== undefined) giveBack(this.#store, ask, hash, now);
    const result = await admitWithTeam(this.#store, this.#team, input);
    // Admitted: the lease its trim gave back before may grow again.
    const granted = ask !== undefined && result.ok;
    const lease = granted ? grantLease(this.#store, ask, hash, now, true).lease : null;
    // Durable before any origin is asked to generate for it: the answer leaves once this
    // commit is (the output gate), so a crash at any instant keeps the open row, whose
    // lapsed lease is then billed from the origins' outcome records.
    if (result.ok || ask !== undefined) this.#store.flush();
    if (result.ok) await this.#ensureAlarm(result.leaseExpiresAt);
    await this.#leaseAlarm();
    await this.#alarmFor(settled, now);
    await this.#teamAlarm(now);
    return { ...result, ...(ask !== undefined && { lease }), commit: this.#store.stamp() };
  }

  /** Renews, grants or releases an isolate's lease, settling what it carries; committed. */
  async lease(call: LeaseCall): Promise<LeaseAnswer> {
    const now = call.now ?? Date.now();
    const settled = (call.settle ?? []).map((one) => settle(this.#store, one, one.now ?? now));
    const outcome = answerLeaseCall(this.#store, call, call.secretHash, now);
    this.#store.flush();
    await this.#leaseAlarm();
    await this.#alarmFor(settled, now);
    await this.#teamAlarm(now);
    return { ...outcome, commit: this.#store.stamp() };
  }

  /** Ends a request exactly once: frees its slot and corrects its tokens with real usage. */
  async settle(input: SettleInput): Promise<SettleResult> {
    const [result] = (await this.settleMany([input])).results;
    if (result === undefined) throw new Error("no settle result");
    return result;
  }

  /**
   * Settles several requests in one call, each exactly once (see {@link settle}), and
   * commits before answering (`commit.pending` is `commit.committed`).
   */
  async settleMany(inputs: SettleInput[]): Promise<SettleManyResult> {
    const now = Date.now();
    const results = inputs.map((input) => settle(this.#store, input, input.now ?? now));
    // A settlement sent on its own carries a bill and travels after the response: it is
    // durable before the edge takes it as applied.
    this.#store.flush();
    const commit = this.#store.stamp();
    await this.#alarmFor(results, now);
    await this.#teamAlarm(now);
    return { results, commit };
  }

  /** Reserves a Batch API batch's worst case against the key's and team's budgets (batch-holds.ts). */
  async holdBatch(input: BatchHoldInput): Promise<BatchHoldResult> {
    const held = await holdBatch(this.#store, this.#team, this.ctx.storage.sql, input);
    await this.#teamAlarm(Date.now());
    return held;
  }

  /**
   * Bills a batch's finished lines once per charge number, committed before it answers; a
   * member key reports the cost to its team at once (a batch is never on a request's path);
   * its answer tells the batch to stop when its key may no longer run it.
   */
  async chargeBatch(charge: BatchCharge): Promise<BatchChargeResult> {
    const now = Date.now();
    const charged = chargeBatch(this.#store, this.ctx.storage.sql, charge, now);
    await this.#alertsFor(now);
    if (charged.applied) await this.#team.report();
    await this.#teamAlarm(now);
    return charged;
  }

  /** Gives back what is left of a batch's hold. */
  releaseBatch(batchId: string): void {
    releaseBatch(this.#store, this.ctx.storage.sql, batchId);
  }

  /** How many lapsed requests, and ended leases, the account still asks the origins about. */
  reconciling(): { requests: number; leases: number } {
    return this.#store.ledger.lapsedCount();
  }

  /** The key's request metrics, for the edge's `/metrics` and dashboard (docs/metrics.md). */
  metrics(): KeyMetrics {
    return this.#store.metrics.report(this.#store.key.record);
  }

  /** Commits the writes memory holds ahead of SQLite now (for tests and direct reads). */
  flush(): void {
    this.#store.metrics.countRefusals(Number.POSITIVE_INFINITY);
    this.#store.flush();
  }

  /** Usage rollups by day and model (or of one end user's or tag's requests, or per tag). */
  usage(query: UsageQuery): UsageResult {
    return usageOf(this.#store, query);
  }

  /** The key's budgets now: each window's spend and when it resets. */
  budgetStatus(): BudgetStatus[] {
    return budgetStatusOf(this.#store, Date.now());
  }

  /** One request's ledger record (null when unknown or pruned), for its own key's secret. */
  record(input: { requestId: string; credential?: CheckCredential }): RecordResult {
    return recordOf(this.#store, input);
  }

  /** A page of the key's requests, newest first, filtered (the spend log; no prompt, no output). */
  requests(query: RequestLogQuery): LedgerRecord[] {
    return requestsOf(this.#store, query);
  }

  /**
   * Extends the leases of requests still in flight (the edge renews each while its client
   * is served); answers how many were open. A lapsed lease releases its slot and reservation.
   */
  renew(input: { requestIds: string[]; leaseMs: number; now?: number }): number {
    const now = input.now ?? Date.now();
    const expiresAt = now + clampLease(input.leaseMs);
    let renewed = 0;
    for (const requestId of input.requestIds) {
      if (this.#store.ledger.renew(requestId, expiresAt)) renewed++;
    }
    return renewed;
  }

  /**
   * Releases reservations past their lease, settles the lapsed ones from what the origins
   * remember, and prunes old rows; safe to run twice.
   */
  override async alarm(): Promise<void> {
    this.#alarmAt = null;
    const now = Date.now();
    expireDue(this.#store, now);
    endDueLeases(this.#store, now);
    // A request whose lease lapsed unsettled lost its edge (a restart), as did an ended
    // lease's unreported ones: their origins may still know how they ended.
    await reconcileLapsed(this.#store, this.env.WARMGATE_CONFIG, this.env, now);
    await this.#team.release(now);
    const settings = alertSettings(this.env.WARMGATE_CONFIG);
    raiseAlerts(this.#store, now, () => settings);
    await deliverAlerts(keyBook(this.#store), now, settings, this.env.ALERT_SIGNING_SECRET);
    this.#store.prune(now);
    await this.#rescheduleAlarm(now);
  }

  // Soft limits the settlements crossed raise alerts, which the alarm delivers now.
  async #alertsFor(now: number): Promise<void> {
    const settings = () => alertSettings(this.env.WARMGATE_CONFIG);
    if (raiseAlerts(this.#store, now, settings)) await this.#ensureAlarm(now);
  }

  // Settled rows are pruned in time; rows whose usage is to be asked of the origins, shortly;
  // alerts the settlements raised are sent at once.
  async #alarmFor(results: readonly SettleResult[], now: number): Promise<void> {
    await this.#alertsFor(now);
    if (results.some((result) => result.settled))
      await this.#ensureAlarm(now + LEDGER_RETENTION_MS);
    if (results.some((result) => !result.settled && result.reason === "reconciling")) {
      await this.#ensureAlarm(now + RECONCILE_FIRST_ASK_MS);
    }
  }

  // Tops the team lease up in the background; an idle key gives back what it holds unused,
  // what a background call brought included.
  async #teamAlarm(now: number): Promise<void> {
    const call = this.#team.keepUp(now);
    if (call !== null) this.ctx.waitUntil(call.then(() => this.#teamIdleAlarm()));
    await this.#teamIdleAlarm();
  }

  async #teamIdleAlarm(): Promise<void> {
    const idle = this.#team.idleAt();
    if (idle !== null) await this.#ensureAlarm(idle);
  }

  async #leaseAlarm(): Promise<void> {
    const next = this.#store.leases.nextExpiry();
    if (Number.isFinite(next)) await this.#ensureAlarm(next);
  }

  // Moves the alarm only earlier: a write, and steady admits' leases end after it.
  async #ensureAlarm(at: number): Promise<void> {
    if (this.#alarmAt !== null && this.#alarmAt <= at) return;
    this.#alarmAt = at;
    await this.ctx.storage.setAlarm(at);
  }

  async #rescheduleAlarm(now: number): Promise<void> {
    const open = Math.min(this.#store.ledger.earliestLease(), this.#store.leases.nextExpiry());
    const prunable = this.#store.prunableAt();
    const prune = prunable === null ? [] : [Math.max(prunable, now + PRUNE_INTERVAL_MS)];
    const lapsed = this.#store.ledger.hasLapsed ? [now + RECONCILE_RETRY_MS] : [];
    const alert = this.#store.alerts.nextDue();
    const due = [open, alert, this.#team.alarmAt(now) ?? Number.NaN].filter((at) =>
      Number.isFinite(at),
    );
    const candidates = [...prune, ...lapsed, ...due];
    if (candidates.length === 0) {
      await this.ctx.storage.deleteAlarm();
      return;
    }
    await this.#ensureAlarm(Math.min(...candidates));
  }

  // --- loading -----------------------------------------------------------------------

  async #migrate(): Promise<void> {
    applyMigrations(this.ctx.storage, KEY_ACCOUNT_MIGRATIONS);
    this.#store.load(Date.now());
    restoreLapsed(this.#store);
    this.#alarmAt = await this.ctx.storage.getAlarm();
  }
}
