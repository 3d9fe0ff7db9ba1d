/**
 * Writes a Durable Object makes on its hot path, gathered in memory and committed together
 * in one transaction a little later (docs/key-account.md, "Writing behind"). Writes are
 * keyed: a later write under a key replaces the queued one, and one that became pointless
 * can be dropped. A crash forgets at most the last `delayMs` of writes.
 */
import { logError } from "../contracts/log.ts";
export class WriteBehind {
  readonly #storage: DurableObjectStorage;
  readonly #delayMs: number;
  readonly #onFailure: (error: unknown) => void;
  readonly #pending = new Map<string, () => void>();
  #timer: ReturnType<typeof setTimeout> | null = null;
  #commits = 0;

  /**
   * `delayMs`: the longest a queued write waits for its commit. `onFailure` runs when a
   * commit fails (its writes are gone): an object whose memory is now ahead of its storage
   * for good resets itself there (`ctx.abort()`), to start again from what was committed.
   */
  constructor(
    storage: DurableObjectStorage,
    delayMs: number,
    onFailure: (error: unknown) => void = () => {},
  ) {
    this.#storage = storage;
    this.#delayMs = delayMs;
    this.#onFailure = onFailure;
  }

  /** Queues `write` (synchronous SQL) under `key`, replacing a write queued under it. */
  set(key: string, write: () => void): void {
    this.#pending.set(key, write);
    // Not re-armed by later writes: no write waits longer than the delay.
    this.#timer ??= setTimeout(() => this.#flushFromTimer(), this.#delayMs);
  }

  /** Drops the write queued under `key`; true when there was one. */
  delete(key: string): boolean {
    return this.#pending.delete(key);
  }

  /** Whether a write is queued under `key`. */
  has(key: string): boolean {
    return this.#pending.has(key);
  }

  /** Number of queued writes. */
  get size(): number {
    return this.#pending.size;
  }

  /** Transactions committed so far (a flush with nothing queued commits none). */
  get commits(): number {
    return this.#commits;
  }

  /**
   * Commits every queued write now, in one transaction, in the order first queued. Call it
   * before reading rows the queue may not have written yet.
   */
  flush(): void {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    if (this.#pending.size === 0) return;
    const writes = [...this.#pending.values()];
    this.#pending.clear();
    try {
      this.#storage.transactionSync(() => {
        for (const write of writes) write();
      });
      this.#commits++;
    } catch (error) {
      // The transaction rolled back and its writes are gone from the queue.
      logError("write-behind commit failed", { error });
      this.#onFailure(error);
      throw error;
    }
  }

  #flushFromTimer(): void {
    this.#timer = null;
    try {
      this.flush();
    } catch {
      // Reported and handled in `flush`.
    }
  }
}
