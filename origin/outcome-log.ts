/**
 * What an origin remembers of the items it ran: running, or ended with its outcome and
 * usage, for a while after. An edge that lost a request in a restart settles it from this
 * (`POST /v1/batch/outcomes`, see origin/PROTOCOL.md), so a finished answer is still billed.
 * Bounded in entries and age; the oldest go first.
 */
import {
  type ItemOutcome,
  type ItemRecord,
  type ItemTiming,
  type ItemUsage,
  requestIdOf,
} from "../contracts/protocol/schema.ts";

/** How long an ended item is remembered. */
export const OUTCOME_RETENTION_MS = 15 * 60_000;
/** Most items remembered (about 200 bytes each). */
export const MAX_OUTCOMES = 200_000;

/** Options of an {@link OutcomeLog}. */
export interface OutcomeLogOptions {
  retentionMs?: number;
  maxEntries?: number;
}

interface Entry {
  record: ItemRecord;
  /** Sequence number of the item's latest write: older queue entries for it are stale. */
  seq: number;
}

/** Items by request id, oldest first. */
export class OutcomeLog {
  readonly #byRequest = new Map<string, Map<string, Entry>>();
  // Insertion order is age order: [request id, item id, seq, when].
  readonly #order: [string, string, number, number][] = [];
  #head = 0;
  #seq = 0;
  #size = 0;
  readonly #retentionMs: number;
  readonly #maxEntries: number;

  constructor(options: OutcomeLogOptions = {}) {
    this.#retentionMs = options.retentionMs ?? OUTCOME_RETENTION_MS;
    this.#maxEntries = options.maxEntries ?? MAX_OUTCOMES;
  }

  /** Number of items remembered. */
  get size(): number {
    return this.#size;
  }

  /** An item began running. */
  started(itemId: string, now: number): void {
    this.#put(itemId, { id: itemId, state: "running" }, now);
  }

  /** An item ended: its outcome and usage, and its END's timing when known. */
  ended(
    itemId: string,
    outcome: ItemOutcome,
    usage: ItemUsage | null,
    now: number,
    timing?: ItemTiming,
  ): void {
    const record: ItemRecord = { id: itemId, state: "ended", outcome, usage };
    if (timing !== undefined) record.timing = timing;
    this.#put(itemId, record, now);
  }

  /** Whether item `itemId` is remembered (running or ended). */
  known(itemId: string): boolean {
    return this.#byRequest.get(requestIdOf(itemId))?.has(itemId) ?? false;
  }

  /**
   * Every remembered item of the given requests and of the requests whose id starts with
   * one of `prefixes` (their attempts included), each once. A prefix reads every remembered
   * request once: they are asked for rarely (a key's lease that lapsed unreported).
   */
  lookup(
    requestIds: readonly string[],
    now: number,
    prefixes: readonly string[] = [],
  ): ItemRecord[] {
    this.#evict(now);
    const wanted = new Set(requestIds);
    if (prefixes.length > 0) {
      // By length, so that each request id is sliced once per length, not per prefix.
      const byLength = new Map<number, Set<string>>();
      for (const prefix of prefixes) {
        const same = byLength.get(prefix.length);
        if (same === undefined) byLength.set(prefix.length, new Set([prefix]));
        else same.add(prefix);
      }
      for (const id of this.#byRequest.keys()) {
        for (const [length, same] of byLength) {
          if (same.has(id.slice(0, length))) wanted.add(id);
        }
      }
    }
    const found: ItemRecord[] = [];
    for (const id of wanted) {
      for (const entry of this.#byRequest.get(id)?.values() ?? []) found.push(entry.record);
    }
    return found;
  }

  #put(itemId: string, record: ItemRecord, now: number): void {
    const requestId = requestIdOf(itemId);
    let items = this.#byRequest.get(requestId);
    if (items === undefined) {
      items = new Map();
      this.#byRequest.set(requestId, items);
    }
    if (!items.has(itemId)) this.#size++;
    const seq = ++this.#seq;
    items.set(itemId, { record, seq });
    this.#order.push([requestId, itemId, seq, now]);
    this.#evict(now);
  }

  #evict(now: number): void {
    const oldest = now - this.#retentionMs;
    while (this.#head < this.#order.length) {
      const entry = this.#order[this.#head];
      if (entry === undefined) break;
      const [requestId, itemId, seq, at] = entry;
      if (at > oldest && this.#size <= this.#maxEntries) break;
      this.#head++;
      const items = this.#byRequest.get(requestId);
      // Only the item's latest write removes it: its start is stale once it ended.
      if (items === undefined || items.get(itemId)?.seq !== seq) continue;
      items.delete(itemId);
      this.#size--;
      if (items.size === 0) this.#byRequest.delete(requestId);
    }
    // Drop the consumed prefix now and then, so the queue does not grow for ever.
    if (this.#head > 1_024 && this.#head * 2 > this.#order.length) {
      this.#order.splice(0, this.#head);
      this.#head = 0;
    }
  }
}
