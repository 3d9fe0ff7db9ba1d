/**
 * Settlements on their way to their key's KeyAccount. A settlement rides on the next
 * admit call of the same key from this isolate, so a busy key costs one Durable Object
 * call per request instead of two; when no admit call carried it within
 * {@link SETTLE_FLUSH_MS}, it goes in a call of its own.
 *
 * Each settlement is waited for in its own request's context (under `waitUntil`), and no
 * promise is resolved across requests: a carrying call only sets a flag, which the
 * settlement's own timer reads. A settlement whose carrying call is still under way when
 * the timer fires is sent again; settling is idempotent by request id, so it is applied once.
 */
/** Longest time a settlement waits for an admit call to carry it. */
export const SETTLE_FLUSH_MS = 20;

/** Pause before a failed settlement call is tried once more. */
export const SETTLE_RETRY_MS = 1_000;

/** What a queued settlement needs: the request it settles (the rest is the account's business). */
export interface QueuedSettlement {
  requestId: string;
}

/** Sends settlements of one key to its account in one call. */
export type SendSettlements<T> = (keyId: string, inputs: T[]) => Promise<unknown>;

interface Entry<T> {
  input: T;
  /** Set once a call that carried it succeeded. */
  applied: boolean;
}

/** Settlements an admit call carries. */
export interface CarriedSettlements<T> {
  inputs: T[];
  /** Marks them applied, once the call that carried them succeeded. */
  confirm(): void;
}

/** Per-isolate queue of settlements, by key id. */
export class SettleQueue<T extends QueuedSettlement> {
  #queues = new Map<string, Entry<T>[]>();

  /** Queues a settlement; resolves once the key's account has applied it (or it was given up). */
  async settle(keyId: string, input: T, send: SendSettlements<T>): Promise<void> {
    const entry: Entry<T> = { input, applied: false };
    const queue = this.#queues.get(keyId) ?? [];
    queue.push(entry);
    this.#queues.set(keyId, queue);
    await sleep(SETTLE_FLUSH_MS);
    if (entry.applied) return;
    // Everything still queued for the key goes along; this entry too if a call carrying
    // it is still under way (a duplicate is harmless).
    const queued = this.#take(keyId);
    const entries = queued.includes(entry) ? queued : [...queued, entry];
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        await send(
          keyId,
          entries.map((e) => e.input),
        );
        for (const e of entries) e.applied = true;
        return;
      } catch (error) {
        console.error("settling failed", keyId, entries.length, error);
        if (attempt === 0) await sleep(SETTLE_RETRY_MS);
      }
    }
    // Still open: the key's alarm closes the reservations when their lease ends.
    console.error("settlements given up until their lease ends", keyId, entries.length);
  }

  /**
   * Takes the key's queued settlements for an admit call to carry; call `confirm` once
   * that call succeeded (a failed call needs nothing: their own timers send them again).
   */
  take(keyId: string): CarriedSettlements<T> {
    const entries = this.#take(keyId);
    return {
      inputs: entries.map((entry) => entry.input),
      confirm: () => {
        for (const entry of entries) entry.applied = true;
      },
    };
  }

  /** Settlements queued for a key (for tests and diagnostics). */
  queued(keyId: string): number {
    return this.#queues.get(keyId)?.length ?? 0;
  }

  #take(keyId: string): Entry<T>[] {
    const entries = this.#queues.get(keyId) ?? [];
    this.#queues.delete(keyId);
    return entries;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
