/**
 * The origin's log of its engine's prefix-cache changes in the edge's block hashes
 * (docs/routing.md, "Block events"): each prompt the origin serves is hashed as the edge
 * hashes it, the engine's stored blocks are mapped onto those hashes in proportion to
 * their place in the prompt, and evictions of mapped blocks become removals. A caller's
 * batch call names the last event it saw, and its LOAD frames bring the ones since.
 */
import { type PrefixRequest, promptBlocks } from "../contracts/prefix-blocks.ts";
import type { KvEventCursor, KvEvents } from "../contracts/protocol/schema.ts";
import type { EngineBlockEvent, EngineBlockHash } from "./engine.ts";

/** How long an ended item's prompt waits for its engine's events. */
const PROMPT_KEPT_MS = 30_000;

/** Most block hashes the log keeps; a caller further behind gets the whole state. */
export const KV_LOG_HASHES = 65_536;

interface Entry {
  seq: number;
  stored: boolean;
  hashes: number[];
}

/** What the engine holds and how it changed, as the edge names blocks. */
export class KvEventLog {
  /** This log's identity: a restarted origin starts a new one. */
  readonly id = crypto.randomUUID();
  readonly #prompts = new Map<string, number[]>();
  readonly #ended: { item: string; at: number }[] = [];
  // Engine block hash -> the edge block hashes it completes.
  readonly #held = new Map<EngineBlockHash, number[]>();
  #entries: Entry[] = [];
  #logged = 0;
  #seq = 0;

  /** Hashes an item's prompt as the edge does, while the item runs. */
  track(item: string, body: string): void {
    try {
      const parsed = JSON.parse(body) as { model?: unknown } & PrefixRequest;
      if (typeof parsed.model !== "string") return;
      if (!("messages" in parsed) && !("prompt" in parsed) && !("input" in parsed)) return;
      this.#prompts.set(item, promptBlocks(parsed.model, parsed));
    } catch {
      // The engine answers a body it cannot parse; there are no blocks to follow.
    }
  }

  /**
   * The item ended. Its prompt is kept a while: an engine may report its blocks later
   * (vLLM publishes its events apart from the response).
   */
  untrack(item: string, now = Date.now()): void {
    this.#ended.push({ item, at: now });
    while ((this.#ended[0]?.at ?? now) < now - PROMPT_KEPT_MS) {
      const done = this.#ended.shift();
      if (done !== undefined) this.#prompts.delete(done.item);
    }
  }

  /** Applies one engine event. */
  apply(event: EngineBlockEvent): void {
    switch (event.kind) {
      case "stored": {
        const edge = this.#prompts.get(event.item);
        if (edge === undefined || event.promptBlocks === 0) return;
        const stored: number[] = [];
        const g = event.promptBlocks;
        const n = edge.length;
        for (const [k, hash] of event.hashes.entries()) {
          const j = event.start + k;
          if (j >= g) break;
          const part = edge.slice(Math.floor((j * n) / g), Math.floor(((j + 1) * n) / g));
          this.#held.set(hash, part);
          stored.push(...part);
        }
        if (stored.length > 0) this.#append(true, stored);
        return;
      }
      case "removed": {
        const removed: number[] = [];
        for (const hash of event.hashes) {
          const part = this.#held.get(hash);
          if (part === undefined) continue;
          this.#held.delete(hash);
          removed.push(...part);
        }
        if (removed.length > 0) this.#append(false, removed);
        return;
      }
      case "cleared":
        this.#held.clear();
        this.#entries = [];
        this.#logged = 0;
        this.#seq += 1;
        return;
    }
  }

  /**
   * The events after `cursor`, net of each other; the whole state (with `cleared`) for a
   * cursor of another log or older than the log keeps.
   */
  since(cursor: KvEventCursor): KvEvents {
    const first = this.#entries[0]?.seq ?? this.#seq + 1;
    if (cursor.log !== this.id || cursor.seq < first - 1 || cursor.seq > this.#seq) {
      const stored: number[] = [];
      for (const part of this.#held.values()) stored.push(...part);
      return { log: this.id, seq: this.#seq, stored, removed: [], cleared: true };
    }
    const last = new Map<number, boolean>();
    for (const entry of this.#entries) {
      if (entry.seq <= cursor.seq) continue;
      for (const hash of entry.hashes) last.set(hash, entry.stored);
    }
    const stored: number[] = [];
    const removed: number[] = [];
    for (const [hash, held] of last) (held ? stored : removed).push(hash);
    return { log: this.id, seq: this.#seq, stored, removed, cleared: false };
  }

  #append(stored: boolean, hashes: number[]): void {
    this.#seq += 1;
    this.#entries.push({ seq: this.#seq, stored, hashes });
    this.#logged += hashes.length;
    while (this.#logged > KV_LOG_HASHES && this.#entries.length > 1) {
      const dropped = this.#entries.shift() as Entry;
      this.#logged -= dropped.hashes.length;
    }
  }
}
