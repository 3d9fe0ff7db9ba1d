/**
 * A key's requests in flight in this isolate (docs/key-account.md, "Concurrency"), so that
 * a request refused for the key's concurrency can wait a moment for one of them to end. A
 * client that cancels a stream and at once sends its next request is usually faster than
 * the runtime's word that it left (the edge hears of it at the stream's next write), and
 * would otherwise be refused a slot it no longer holds. Each request that ends wakes one
 * waiter, the one that looks first: an over-limit burst asks its account again once per
 * freed slot, not once per waiter. Requests share counts, never promises: a waiter looks
 * again on its own timer (no I/O crosses requests in Workers).
 */

/** How often a waiting request looks whether one of its key's requests ended, ms. */
const POLL_MS = 5;

/** Requests admitted and not yet ended, and those ended so far, by key. */
export class KeyRequests {
  readonly #running = new Map<string, number>();
  // Waiters now, and requests ended since that no waiter took yet, by key.
  readonly #waiting = new Map<string, number>();
  readonly #freed = new Map<string, number>();

  /** A request of `keyId` was admitted; the returned function ends it (once). */
  started(keyId: string): () => void {
    this.#running.set(keyId, this.count(keyId) + 1);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const left = this.count(keyId) - 1;
      if (left > 0) this.#running.set(keyId, left);
      else this.#running.delete(keyId);
      const waiting = this.#waiting.get(keyId) ?? 0;
      const freed = this.#freed.get(keyId) ?? 0;
      if (freed < waiting) this.#freed.set(keyId, freed + 1);
    };
  }

  /** Requests of `keyId` in flight here. */
  count(keyId: string): number {
    return this.#running.get(keyId) ?? 0;
  }

  /**
   * True once a request of `keyId` ends that no other waiter took; false after `ms`, or at
   * once when none runs here.
   */
  async whenOneEnds(keyId: string, ms: number): Promise<boolean> {
    const until = Date.now() + ms;
    this.#waiting.set(keyId, (this.#waiting.get(keyId) ?? 0) + 1);
    try {
      while (this.count(keyId) > 0 && Date.now() < until) {
        await new Promise((resolve) => setTimeout(resolve, POLL_MS));
        const freed = this.#freed.get(keyId) ?? 0;
        if (freed > 0) {
          this.#freed.set(keyId, freed - 1);
          return true;
        }
      }
      return false;
    } finally {
      const waiting = (this.#waiting.get(keyId) ?? 1) - 1;
      if (waiting > 0) this.#waiting.set(keyId, waiting);
      else this.#waiting.delete(keyId);
      // An end no waiter is left to take is not kept for waiters yet to come.
      if ((this.#freed.get(keyId) ?? 0) > waiting) {
        if (waiting > 0) this.#freed.set(keyId, waiting);
        else this.#freed.delete(keyId);
      }
    }
  }
}
