/**
 * Cancels an origin received for items or batches it did not know yet (origin/PROTOCOL.md,
 * "Cancellation"): a cancel may overtake the batch it names, on another connection, and
 * must still stop it. Remembered for a while, bounded in entries; the oldest go first.
 */

/** How long a cancel for an unknown item or batch is remembered. */
export const CANCEL_RETENTION_MS = 60_000;
/** Most cancels remembered. */
export const MAX_CANCELS = 100_000;

/** Options of a {@link CancelMemory}. */
export interface CancelMemoryOptions {
  retentionMs?: number;
  maxEntries?: number;
}

/** Keys (item or batch ids) cancelled before they arrived, oldest first. */
export class CancelMemory {
  // Insertion order is age order.
  readonly #at = new Map<string, number>();
  readonly #retentionMs: number;
  readonly #maxEntries: number;

  constructor(options: CancelMemoryOptions = {}) {
    this.#retentionMs = options.retentionMs ?? CANCEL_RETENTION_MS;
    this.#maxEntries = options.maxEntries ?? MAX_CANCELS;
  }

  /** Number of cancels remembered. */
  get size(): number {
    return this.#at.size;
  }

  /** Remembers a cancel for `key`, which this origin does not know yet. */
  remember(key: string, now: number): void {
    this.#at.delete(key);
    this.#at.set(key, now);
    this.#evict(now);
  }

  /** Whether `key` was cancelled before it came; the cancel is used up. */
  take(key: string, now: number): boolean {
    this.#evict(now);
    return this.#at.delete(key);
  }

  #evict(now: number): void {
    for (const [key, at] of this.#at) {
      if (at > now - this.#retentionMs && this.#at.size <= this.#maxEntries) return;
      this.#at.delete(key);
    }
  }
}
