/**
 * Settlements on their way to their key's KeyAccount (docs/edge.md, "Settlement"): each
 * rides on the next admit or lease call of the same key, or goes in a call of its own after
 * {@link SETTLE_FLUSH_MS}, {@link SETTLE_LINGER_MS} while others of its key wait too (or as
 * long as it is told it may wait); a carried one is held until an answer of the same incarnation reports the commit
 * it landed in, and sent again otherwise. Settling is idempotent, and no promise is resolved
 * across requests.
 */
import { logError } from "../../contracts/log.ts";
import type { CommitStamp } from "../../contracts/commit-stamp.ts";
import { sleep } from "../../contracts/sleep.ts";

/** Longest time a settlement waits for a call to carry it, unless told otherwise. */
export const SETTLE_FLUSH_MS = 20;

/**
 * Longest time it waits when, by then, others of its key wait too: traffic flows, and a call
 * of its own costs the account a commit. At a few hundred requests a second one call then
 * carries twenty settlements where 20 ms carried four, 0.12 ms less workerd CPU a request
 * (docs/benchmarks.md, "Where one request's CPU goes"); a lone request's waits no longer.
 */
export const SETTLE_LINGER_MS = 100;

/**
 * Settlements of a key that go at once, whatever their wait: a burst's thousands of endings
 * leave in calls of this many instead of one call every wait that the account then spends
 * a long turn applying (locally on the thread that serves the next request). Twenty a call
 * at one client's rate stay below it.
 */
export const SETTLE_CALL_MAX = 64;

/**
 * Time beyond the account's write delay that a carried settlement waits for an answer to
 * confirm it: the commit becoming durable and a later call reporting it.
 */
export const SETTLE_CONFIRM_MARGIN_MS = 100;

/** Pause before a failed settlement call is tried once more. */
export const SETTLE_RETRY_MS = 1_000;

/** What a queued settlement needs: the request it settles (the rest is the account's business). */
export interface QueuedSettlement {
  requestId: string;
}

/** Sends settlements of one key to its account in one call, committed when it answers. */
export type SendSettlements<T> = (keyId: string, inputs: T[]) => Promise<CommitStamp>;

/** How the queue waits for the account. */
export interface SettleQueueOptions {
  /** The account's write-behind delay: the longest a carried settlement waits for its commit. */
  writeDelayMs: number;
}

type EntryState =
  // Waiting for a call to carry it.
  | { kind: "queued" }
  // A call carrying it is under way.
  | { kind: "sent" }
  // In the account's memory, durable once `incarnation` reports `commit` committed.
  | { kind: "applied"; incarnation: string; commit: number }
  // Durable, or given up.
  | { kind: "done" };

interface Entry<T> {
  input: T;
  state: EntryState;
}

// A key's settlements by state: an entry is in `queued` or `applied` exactly when its state
// says so (those in a call under way, and those done, are in neither).
interface KeyEntries<T> {
  queued: Set<Entry<T>>;
  applied: Set<Entry<T>>;
}

/** Settlements an admit call carries. */
export interface CarriedSettlements<T> {
  inputs: T[];
  /**
   * Reports the call's answer: it applied the settlements it carried, and it confirms the
   * key's earlier ones or sends them again. Call it for every admit of the key, even one
   * that carried nothing (a failed call needs nothing: their own timers send them again).
   */
  answered(commit: CommitStamp): void;
}

/** Per-isolate queue of settlements, by key id. */
export class SettleQueue<T extends QueuedSettlement> {
  readonly #confirmMs: number;
  readonly #keys = new Map<string, KeyEntries<T>>();

  constructor(options: SettleQueueOptions) {
    this.#confirmMs = options.writeDelayMs + SETTLE_CONFIRM_MARGIN_MS;
  }

  /**
   * Queues a settlement, to wait at most `flushMs` for a call of its key to carry it;
   * resolves once the key's account holds it durably (or it was given up, and the key's
   * alarm closes the reservation when its lease ends).
   */
  async settle(
    keyId: string,
    input: T,
    send: SendSettlements<T>,
    flushMs = SETTLE_FLUSH_MS,
  ): Promise<void> {
    const entry: Entry<T> = { input, state: { kind: "queued" } };
    this.#move(keyId, entry, entry.state);
    try {
      // A full call's worth waits no longer: this one sends them all now.
      if (this.queued(keyId) < SETTLE_CALL_MAX) {
        await sleep(flushMs);
        // Others of the key came meanwhile: wait on, so that one call carries them all.
        if (entry.state.kind === "queued" && flushMs < SETTLE_LINGER_MS && this.queued(keyId) > 1) {
          await sleep(SETTLE_LINGER_MS - flushMs);
        }
        // Carried: a later answer confirms it, unless traffic stopped.
        if (entry.state.kind === "sent" || entry.state.kind === "applied") {
          await sleep(this.#confirmMs);
        }
      }
      if (entry.state.kind !== "done") await this.#sendAlone(keyId, entry, send);
    } finally {
      this.#move(keyId, entry, { kind: "done" });
    }
  }

  /** Takes the key's queued settlements for an admit call to carry. */
  take(keyId: string): CarriedSettlements<T> {
    const entries = [...(this.#keys.get(keyId)?.queued ?? [])];
    for (const entry of entries) this.#move(keyId, entry, { kind: "sent" });
    return {
      inputs: entries.map((entry) => entry.input),
      answered: (commit) => this.#answered(keyId, entries, commit),
    };
  }

  /** Settlements of a key waiting for a call to carry them (for tests and diagnostics). */
  queued(keyId: string): number {
    return this.#keys.get(keyId)?.queued.size ?? 0;
  }

  /** Settlements of a key applied but not yet known durable (for tests and diagnostics). */
  unconfirmed(keyId: string): number {
    return this.#keys.get(keyId)?.applied.size ?? 0;
  }

  // Sends everything of the key not known durable, this entry too if a call carrying it is
  // still under way (a duplicate is harmless).
  async #sendAlone(keyId: string, entry: Entry<T>, send: SendSettlements<T>): Promise<void> {
    let count = 0;
    for (let attempt = 0; attempt < 2; attempt++) {
      const key = this.#keys.get(keyId);
      const entries = new Set([...(key?.queued ?? []), ...(key?.applied ?? []), entry]);
      for (const e of entries) this.#move(keyId, e, { kind: "sent" });
      count = entries.size;
      try {
        const commit = await send(
          keyId,
          [...entries].map((e) => e.input),
        );
        // The account committed before answering: all of them are durable.
        this.#answered(keyId, [...entries], commit);
        return;
      } catch (error) {
        logError("settling failed", { key_id: keyId, count, error });
        // Back in the queue: an admit call may carry them meanwhile.
        for (const e of entries) {
          if (e.state.kind === "sent") this.#move(keyId, e, { kind: "queued" });
        }
      }
      if (attempt === 0) await sleep(SETTLE_RETRY_MS);
      if (entry.state.kind === "done") return;
    }
    logError("settlements given up until their lease ends", { key_id: keyId, count });
  }

  #answered(keyId: string, carried: Entry<T>[], commit: CommitStamp): void {
    for (const entry of carried) {
      if (entry.state.kind === "done") continue;
      this.#move(keyId, entry, {
        kind: "applied",
        incarnation: commit.incarnation,
        commit: commit.pending,
      });
    }
    for (const entry of this.#keys.get(keyId)?.applied ?? []) {
      if (entry.state.kind !== "applied") continue;
      if (entry.state.incarnation !== commit.incarnation) {
        // The account restarted since, maybe before committing it: the next call carries it.
        this.#move(keyId, entry, { kind: "queued" });
      } else if (entry.state.commit <= commit.committed) {
        this.#move(keyId, entry, { kind: "done" });
      }
    }
  }

  // Sets an entry's state and keeps the key's sets in step (deleting from a Set while
  // iterating it is safe); a key with nothing left is forgotten.
  #move(keyId: string, entry: Entry<T>, state: EntryState): void {
    let key = this.#keys.get(keyId);
    if (key === undefined) {
      key = { queued: new Set(), applied: new Set() };
      this.#keys.set(keyId, key);
    }
    key.queued.delete(entry);
    key.applied.delete(entry);
    entry.state = state;
    if (state.kind === "queued") key.queued.add(entry);
    if (state.kind === "applied") key.applied.add(entry);
    if (key.queued.size === 0 && key.applied.size === 0) this.#keys.delete(keyId);
  }
}
