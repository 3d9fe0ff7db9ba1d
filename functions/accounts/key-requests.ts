/**
 * A key's requests in flight in this isolate (docs/key-account.md, "Concurrency"), so that
 * a request refused for the key's concurrency can wait a moment for one of them to end. A
 * client that cancels a stream and at once sends its next request is usually faster than
 * the runtime's word that it left (the edge hears of it at the stream's next write), and
 * would otherwise be refused a slot it no longer holds. Each request that ends frees one
 * wake-up, taken by the first waiter that looks and was refused before that end: an
 * over-limit burst asks its account again once per freed slot, not once per waiter, and an
 * end heard while the refused request's call was still under way is not lost. Requests share
 * counts, never promises: a waiter looks again on its own timer (no I/O crosses requests in
 * Workers).
 */
import { sleep } from "../../contracts/sleep.ts";

/** How often a waiting request looks whether one of its key's requests ended, ms. */
const POLL_MS = 5;

/** How long an end nobody took is kept for a waiter refused before it, ms. */
const END_KEPT_MS = 1_000;

/** Most ends kept per key, and keys with ends kept before they are swept. */
const MAX_KEPT_ENDS = 256;
const MAX_KEYS = 1_024;

/** Requests admitted and not yet ended, and the recent ends no waiter took, by key. */
export class KeyRequests {
  readonly #running = new Map<string, number>();
  // Requests asking their account for a slot now: only then is an end kept.
  readonly #asking = new Map<string, number>();
  // When each end happened, oldest first.
  readonly #ends = new Map<string, number[]>();

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
      // No one asks: no one could take it (a waiter takes ends after its own ask began).
      if (this.#asking.has(keyId)) this.giveBack(keyId, Date.now());
    };
  }

  /** A request of `keyId` asks its account for a slot; the returned function ends that (once). */
  asking(keyId: string): () => void {
    this.#asking.set(keyId, (this.#asking.get(keyId) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const left = (this.#asking.get(keyId) ?? 1) - 1;
      if (left > 0) this.#asking.set(keyId, left);
      else this.#asking.delete(keyId);
    };
  }

  /** Requests of `keyId` in flight here. */
  count(keyId: string): number {
    return this.#running.get(keyId) ?? 0;
  }

  /**
   * When a request of `keyId` ended at or after `since` (the refused call's start) that no
   * other waiter took: this waiter takes it. Null after `ms`, or at once when none runs here
   * and none ended since.
   */
  async whenOneEnds(keyId: string, ms: number, since: number): Promise<number | null> {
    const until = Date.now() + ms;
    for (;;) {
      const taken = this.#take(keyId, since);
      if (taken !== null) return taken;
      if (this.count(keyId) === 0 || Date.now() >= until) return null;
      await sleep(POLL_MS);
    }
  }

  /** An end at `at` (one a waiter took and could not use): the next waiter may take it. */
  giveBack(keyId: string, at: number): void {
    const now = Date.now();
    if (this.#ends.size > MAX_KEYS) this.#sweep(now);
    const ends = this.#fresh(keyId, now) ?? [];
    let i = ends.length;
    while (i > 0 && (ends[i - 1] ?? 0) > at) i--;
    ends.splice(i, 0, at);
    if (ends.length > MAX_KEPT_ENDS) ends.shift();
    this.#ends.set(keyId, ends);
  }

  // The oldest end at or after `since` no waiter took, removed; null when none.
  #take(keyId: string, since: number): number | null {
    const ends = this.#fresh(keyId, Date.now());
    const i = ends?.findIndex((end) => end >= since) ?? -1;
    if (ends === undefined || i < 0) return null;
    const [taken] = ends.splice(i, 1);
    if (ends.length === 0) this.#ends.delete(keyId);
    return taken ?? null;
  }

  // The key's ends kept as of `now` (older ones dropped); undefined when none.
  #fresh(keyId: string, now: number): number[] | undefined {
    const ends = this.#ends.get(keyId);
    if (ends === undefined) return undefined;
    while (ends.length > 0 && (ends[0] ?? 0) <= now - END_KEPT_MS) ends.shift();
    if (ends.length > 0) return ends;
    this.#ends.delete(keyId);
    return undefined;
  }

  // Drops every key's ends past keeping.
  #sweep(now: number): void {
    // Deleting while iterating a Map visits each remaining entry once.
    for (const keyId of this.#ends.keys()) this.#fresh(keyId, now);
  }
}
