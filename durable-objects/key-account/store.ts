/**
 * What a key account holds, memory ahead of SQLite and written behind, and every SQL
 * statement it runs (docs/key-account.md, "Storage"): the record and secrets, the buckets,
 * the ledger, spend and usage, and the metrics, one store each (store/), sharing one
 * write-behind queue. Nothing here decides: admit.ts and settle.ts do, with the cores.
 */
import type { CommitStamp } from "../../contracts/commit-stamp.ts";
import { WriteBehind } from "../write-behind.ts";
import type { ScopeUsage } from "./admission.ts";
import type { LedgerChange } from "./ledger.ts";
import { KEY_SCOPE, type LedgerEntry } from "./schema.ts";
import { AlertStore } from "./store/alerts.ts";
import { BucketStore } from "./store/buckets.ts";
import { KeyStore } from "./store/key.ts";
import { LeaseStore } from "./store/leases.ts";
import { LedgerStore } from "./store/ledger.ts";
import { MetricsStore } from "./store/metrics.ts";
import { SpendStore } from "./store/spend.ts";
import { TeamPoolStore } from "./store/team.ts";
import { ACCOUNT_WRITE_DELAY_MS } from "./types.ts";

/** The bucket scope of one end user of browser tokens. */
export function userScope(subject: string): string {
  return `u:${subject}`;
}

/** The bucket scope of the key's own limits for one model (`model_limits`). */
export function modelScope(model: string): string {
  return `m:${model}`;
}

/** One key account's state, memory ahead of SQLite. */
export class AccountStore {
  /** The key's record and secrets, written at once. */
  readonly key: KeyStore;
  /** The rate-limit buckets of the key and of its end users. */
  readonly buckets: BucketStore;
  /** The ledger: open rows, lapsed requests, every row's writes. */
  readonly ledger: LedgerStore;
  /** Spend per budget period and usage per day and model. */
  readonly spend: SpendStore;
  /** The leases isolates hold. */
  readonly leases: LeaseStore;
  /** The key's request metrics. */
  readonly metrics: MetricsStore;
  /** The key's lease of its team's allowance (null pool: no team). */
  readonly team: TeamPoolStore;
  /** Its soft-budget alerts. */
  readonly alerts: AlertStore;
  readonly #writes: WriteBehind;
  // New with every start: an answer's stamp says which run its commits belong to.
  readonly #incarnation = crypto.randomUUID();

  /** `onCommitFailed` runs when a write-behind commit fails (see WriteBehind). */
  constructor(storage: DurableObjectStorage, onCommitFailed: () => void) {
    this.#writes = new WriteBehind(storage, ACCOUNT_WRITE_DELAY_MS, onCommitFailed);
    this.key = new KeyStore(storage);
    this.buckets = new BucketStore(storage.sql, this.#writes);
    this.ledger = new LedgerStore(storage.sql, this.#writes);
    this.spend = new SpendStore(storage.sql, this.#writes);
    this.leases = new LeaseStore(storage.sql, this.#writes);
    this.metrics = new MetricsStore(storage.sql, this.#writes);
    this.team = new TeamPoolStore(storage.sql, this.#writes);
    this.alerts = new AlertStore(storage.sql, this.#writes);
  }

  /** Loads the record, the secrets and the open and lapsed ledger rows (at start). */
  load(now: number): void {
    this.key.load();
    this.ledger.load(now);
    this.leases.load();
    this.team.load();
    this.alerts.load();
  }

  /** Where this answer stands among the commits, taken as the call answers, after its last write. */
  stamp(): CommitStamp {
    const committed = this.#writes.commits;
    return {
      incarnation: this.#incarnation,
      committed,
      pending: this.#writes.size === 0 ? committed : committed + 1,
    };
  }

  /** Commits the writes memory holds ahead of SQLite now. */
  flush(): void {
    this.#writes.flush();
  }

  /**
   * A scope's buckets and its requests in flight, counting the slots its leases hold
   * (`subject` null: the key's, and every lease's).
   */
  scopeUsage(scope: string, subject: string | null): ScopeUsage {
    const leased = this.leases.slots(subject);
    return { ...this.buckets.of(scope), inFlight: this.ledger.inFlight(subject) + leased };
  }

  /** Applies what a ledger event changed (ledger.ts): the buckets, the row, spend and usage. */
  apply(before: LedgerEntry, change: LedgerChange, now: number): void {
    const { row } = change;
    if (change.tokens !== 0) {
      this.buckets.adjustTokens(KEY_SCOPE, this.key.record?.limits.tpm ?? 0, change.tokens, now);
      if (row.subject !== null && row.subjectTpm !== null) {
        this.buckets.adjustTokens(userScope(row.subject), row.subjectTpm, change.tokens, now);
      }
      // The models with their own token limits that the request was counted against.
      const modelLimits = this.key.record?.modelLimits ?? {};
      for (const model of new Set(row.candidates.map(([name]) => name))) {
        const tpm = modelLimits[model]?.tpm ?? null;
        if (tpm !== null) this.buckets.adjustTokens(modelScope(model), tpm, change.tokens, now);
      }
    }
    this.ledger.close(before, row);
    this.spend.add(row.hour, change.spend, row.subject);
    this.team.settled(change.spend.settledPicos, change.tokens);
    for (const delta of change.usage) this.spend.addUsage(row.day, delta);
  }

  /** Commits, then deletes what is past its retention; memory reloads what is left. */
  prune(now: number): void {
    this.#writes.flush();
    this.ledger.prune(now);
    this.leases.prune(now);
    this.buckets.prune(now);
    this.spend.prune(now);
    this.alerts.prune(now);
    this.key.prune(now);
  }

  /**
   * When the next row can be pruned (closed ledger rows, idle buckets, ended leases); null
   * when none.
   */
  prunableAt(): number | null {
    const times = [this.ledger.prunableAt(), this.buckets.prunableAt(), this.leases.prunableAt()];
    const due = times.filter((at): at is number => at !== null);
    return due.length === 0 ? null : Math.min(...due);
  }
}
