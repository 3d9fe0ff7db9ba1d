/**
 * A Batcher's router (docs/routing.md): places each request on an origin with
 * `choosePlacement`, keeps the prefix index and the sessions it learns from placements,
 * and corrects them from what origins report: `cached_tokens` at each END, restarts and
 * KV size in load reports, and block events where the engine sends them. Pure: no clock
 * or I/O; snapshots are plain JSON.
 */
import { BLOCK_TOKENS, COLD_KEY_BLOCKS } from "../../../contracts/prefix-blocks.ts";
import type { KvEventCursor, KvEvents } from "../../../contracts/protocol/schema.ts";
import {
  PLACEMENT_REASONS,
  type PlacementChoice,
  type PlacementReason,
  type RouteCandidate,
  choosePlacement,
  mix32,
  uncachedTokens,
} from "./placement.ts";
import { PrefixIndex, type PrefixIndexSnapshot } from "./prefix-index.ts";
import type { RouterSettings } from "../../../contracts/config/routing.ts";

/** A request to place. */
export interface RouteRequest {
  id: string;
  /** Its prefix blocks' chain hashes (see contracts/prefix-blocks.ts). */
  blocks: readonly number[];
  promptTokens: number;
  /** Its session (the OpenAI `user` field or the session header), if any. */
  session: string | null;
  /** An origin the request asks for (the override header, where its key allows it). */
  pinned: string | null;
}

/** The parts of a load report the router reads. */
export interface RouterReport {
  /** KV capacity in engine tokens. */
  kvTotalTokens: number;
  /** Prompt tokens the engine has looked up since it started (falls at a restart). */
  prefixQueries: number;
  /** When the origin wrote the report (its clock, ms). */
  at: number;
}

/** The index as the admin view shows it, per origin and in all. */
export interface RouterView {
  origins: Record<string, { blocks: number; capacity_blocks: number; placements: number }>;
  placements: Record<PlacementReason, number>;
  /** Shares of the prompt tokens of ended requests: predicted cached, reported cached. */
  hit_rate: { predicted: number | null; reported: number | null; requests: number };
  sessions: number;
}

/** What a router keeps across restarts of its Batcher. */
export interface RouterSnapshot {
  index: PrefixIndexSnapshot;
  sessions: [string, string][];
  tokensPerEngineToken: number;
}

interface Placed {
  request: RouteRequest;
  slot: number;
  reason: PlacementReason;
  uncached: number;
  started: boolean;
  matched: number;
  /**
   * No request of the same first block was still prefilling there when it was placed: a
   * hit it then does not get means the origin lost the blocks, not that they were late.
   */
  settled: boolean;
  /** When it was placed (ms). */
  at: number;
}

/** Sessions remembered, most recent last. */
const MAX_SESSIONS = 10_000;
/** Shares below and above which a reported hit says the index was wrong. */
const MISPREDICTED = 0.1;

export class Router {
  readonly settings: RouterSettings;
  readonly #index: PrefixIndex;
  readonly #placed = new Map<string, Placed>();
  readonly #sessions = new Map<string, string>();
  readonly #lastReport: ({ at: number; queries: number } | null)[];
  readonly #cursors: (KvEventCursor | null)[];
  // Each origin's share of its KV cache the index assumes is ours, learned from hits.
  readonly #share: number[];
  readonly #kvTokens: (number | null)[];
  readonly #byReason = Object.fromEntries(PLACEMENT_REASONS.map((r) => [r, 0])) as Record<
    PlacementReason,
    number
  >;
  readonly #byOrigin: number[];
  #tokensPerEngineToken = 1;
  #promptTokens = 0;
  #predictedTokens = 0;
  #reportedTokens = 0;
  #ended = 0;

  constructor(origins: readonly string[], settings: RouterSettings) {
    this.settings = settings;
    this.#index = new PrefixIndex(origins, settings.maxIndexBlocks);
    this.#lastReport = origins.map(() => null);
    this.#cursors = origins.map(() => null);
    this.#share = origins.map(() => 1);
    this.#kvTokens = origins.map(() => null);
    this.#byOrigin = origins.map(() => 0);
  }

  /**
   * Prompt tokens `origin` still has to prefill: with its last load report's backlog
   * (`reported`, which every router sees alike), that plus what this router placed there
   * since the report; without one, what this router placed there that has not started.
   */
  backlogTokens(origin: string, reported: { tokens: number; at: number } | null = null): number {
    const slot = this.#index.slot(origin);
    const since = reported?.at ?? Number.NEGATIVE_INFINITY;
    let tokens = reported?.tokens ?? 0;
    for (const placed of this.#placed.values()) {
      if (placed.slot === slot && !placed.started && placed.at >= since) tokens += placed.uncached;
    }
    return tokens;
  }

  /** Where `request` would go among `candidates` (non-empty), without recording it. */
  preview(request: RouteRequest, candidates: readonly RouteCandidate[]): PlacementChoice {
    if (request.pinned !== null) {
      const pinned = candidates.find((c) => c.id === request.pinned);
      if (pinned !== undefined) {
        const matched = this.#matchedOn(request, pinned.id);
        return { origin: pinned.id, reason: "pinned", matchedBlocks: matched, predictedTtftMs: 0 };
      }
    }
    const all = this.#index.match(request.blocks);
    const slots = candidates.map((c) => this.#index.slot(c.id));
    const matched = slots.map((slot) => all[slot] ?? 0);
    // What each cache takes before it evicts, as far as the index follows it.
    const freeTokens = slots.map(
      (slot) => Math.max(0, this.#index.capacity(slot) - this.#index.size(slot)) * BLOCK_TOKENS,
    );
    return choosePlacement(
      candidates,
      {
        blocks: request.blocks,
        promptTokens: request.promptTokens,
        coldKey: coldKey(request),
        matched,
        freeTokens,
        sessionOrigin:
          request.session === null ? null : (this.#sessions.get(request.session) ?? null),
        sharing: (depth) => this.#sharing(request, depth),
      },
      this.settings,
    );
  }

  /** Places `request` at `now` and records it: its blocks now count as held by that origin. */
  place(request: RouteRequest, candidates: readonly RouteCandidate[], now = 0): PlacementChoice {
    const choice = this.preview(request, candidates);
    this.#assign(request, choice.origin, choice.reason, choice.matchedBlocks, now);
    return choice;
  }

  /** Records that `request` goes to `origin` (a placement, or a fallback's) at `now`. */
  #assign(
    request: RouteRequest,
    origin: string,
    reason: PlacementReason,
    matched: number,
    now = 0,
  ): void {
    const slot = this.#index.slot(origin);
    if (slot < 0) return;
    this.forget(request.id);
    const uncached = uncachedTokens(request.promptTokens, request.blocks.length, matched);
    const head = request.blocks[0];
    let settled = true;
    for (const other of this.#placed.values()) {
      if (other.slot === slot && !other.started && other.request.blocks[0] === head) {
        settled = false;
        break;
      }
    }
    this.#placed.set(request.id, {
      request,
      slot,
      reason,
      uncached,
      started: false,
      matched,
      settled,
      at: now,
    });
    this.#index.store(slot, request.blocks);
    this.#byReason[reason] += 1;
    this.#byOrigin[slot] = (this.#byOrigin[slot] ?? 0) + 1;
    if (request.session !== null) {
      this.#sessions.delete(request.session);
      this.#sessions.set(request.session, origin);
      if (this.#sessions.size > MAX_SESSIONS) {
        this.#sessions.delete(this.#sessions.keys().next().value as string);
      }
    }
  }

  /**
   * The request left for another origin than its placement's (that one was down or full
   * when it headed the queue): a fallback, and that origin now holds its blocks.
   */
  moved(id: string, origin: string, now = 0): void {
    const placed = this.#placed.get(id);
    const slot = this.#index.slot(origin);
    if (placed === undefined || slot < 0 || placed.slot === slot) return;
    this.#byReason[placed.reason] -= 1;
    this.#byOrigin[placed.slot] = (this.#byOrigin[placed.slot] ?? 1) - 1;
    const matched = this.#index.match(placed.request.blocks)[slot] ?? 0;
    this.#assign(placed.request, origin, "fallback", matched, now);
  }

  /** The request's first token came: its prefill is no longer ahead of others. */
  started(id: string): void {
    const placed = this.#placed.get(id);
    if (placed === undefined || placed.started) return;
    placed.started = true;
  }

  /**
   * The request ended with the engine's usage: the hit it reported against the one the
   * index predicted. An origin that held less than predicted holds less of our prefixes
   * than assumed (its cache serves others too), so its share shrinks; one that matched
   * the prediction earns some back.
   */
  ended(id: string, usage: { prompt_tokens: number; cached_tokens: number } | null): void {
    const placed = this.#placed.get(id);
    if (placed === undefined) return;
    this.forget(id);
    const blocks = placed.request.blocks.length;
    if (usage === null || usage.prompt_tokens <= 0 || blocks === 0) return;
    const predicted = placed.matched / blocks;
    const reported = Math.min(1, usage.cached_tokens / usage.prompt_tokens);
    this.#ended += 1;
    this.#promptTokens += usage.prompt_tokens;
    this.#predictedTokens += predicted * usage.prompt_tokens;
    this.#reportedTokens += usage.cached_tokens;
    // Edge stand-in tokens per engine token: converts the engine's KV size to blocks.
    const ratio = (blocks * BLOCK_TOKENS) / usage.prompt_tokens;
    this.#tokensPerEngineToken += 0.1 * (ratio - this.#tokensPerEngineToken);
    const slot = placed.slot;
    // Block events say exactly what the engine dropped; without them, a hit that did not
    // come says the origin holds less of ours than assumed.
    if (this.#cursors[slot] !== null || !placed.settled) return;
    const share = this.#share[slot] ?? 1;
    if (reported < predicted - MISPREDICTED) this.#share[slot] = Math.max(0.05, share * 0.8);
    else if (reported >= predicted - MISPREDICTED / 2)
      this.#share[slot] = Math.min(1, share * 1.02);
    this.#resize(slot);
  }

  /** Forgets a request that ended without usage (cancelled, failed, refused). */
  forget(id: string): void {
    this.#placed.delete(id);
  }

  /**
   * A load report: an engine whose lookups counter fell since an earlier report restarted
   * with an empty cache. Reports of concurrent calls may arrive out of order, and two
   * written in the same millisecond (the clock's grain) in either order.
   */
  report(origin: string, report: RouterReport): void {
    const slot = this.#index.slot(origin);
    if (slot < 0) return;
    const last = this.#lastReport[slot] ?? null;
    if (last !== null && report.at < last.at) return;
    if (last !== null && report.prefixQueries < last.queries) {
      if (report.at === last.at) return;
      this.#index.clear(slot);
    }
    this.#lastReport[slot] = { at: report.at, queries: report.prefixQueries };
    if (report.kvTotalTokens > 0) this.#kvTokens[slot] = report.kvTotalTokens;
    this.#resize(slot);
  }

  /** The last block event seen from `origin`, for its next call's `kv_events_after`. */
  cursor(origin: string): KvEventCursor | null {
    return this.#cursors[this.#index.slot(origin)] ?? null;
  }

  /**
   * Block events from the origin's engine: exactly what it stored and dropped. Those a
   * cursor already passed (another call brought them) are skipped.
   */
  events(origin: string, events: KvEvents): void {
    const slot = this.#index.slot(origin);
    if (slot < 0) return;
    const seen = this.#cursors[slot] ?? null;
    const following = seen !== null && seen.log === events.log;
    if (following && events.seq <= seen.seq) return;
    this.#cursors[slot] = { log: events.log, seq: events.seq };
    // The whole state of a log this router did not follow (its first, or the origin
    // restarted) replaces what it guessed; one of a log it follows (a call sent before its
    // cursor moved) adds to it, as it saw every removal.
    if (events.cleared && !following) {
      this.#index.clear(slot);
      // Requests placed there whose prefill has not been reported yet are still coming.
      for (const placed of this.#placed.values()) {
        if (placed.slot === slot) this.#index.store(slot, placed.request.blocks);
      }
    }
    this.#index.remove(slot, events.removed);
    this.#index.store(slot, events.stored);
  }

  view(): RouterView {
    const origins: RouterView["origins"] = {};
    for (const [slot, id] of this.#index.origins.entries()) {
      origins[id] = {
        blocks: this.#index.size(slot),
        capacity_blocks: this.#index.capacity(slot),
        placements: this.#byOrigin[slot] ?? 0,
      };
    }
    const share = (tokens: number) =>
      this.#promptTokens === 0 ? null : Math.round((tokens / this.#promptTokens) * 1e4) / 1e4;
    return {
      origins,
      placements: { ...this.#byReason },
      hit_rate: {
        predicted: share(this.#predictedTokens),
        reported: share(this.#reportedTokens),
        requests: this.#ended,
      },
      sessions: this.#sessions.size,
    };
  }

  snapshot(): RouterSnapshot {
    return {
      index: this.#index.snapshot(),
      sessions: [...this.#sessions.entries()],
      tokensPerEngineToken: this.#tokensPerEngineToken,
    };
  }

  restore(snapshot: RouterSnapshot): void {
    this.#index.restore(snapshot.index);
    for (const [session, origin] of snapshot.sessions) {
      if (this.#index.slot(origin) >= 0) this.#sessions.set(session, origin);
    }
    if (snapshot.tokensPerEngineToken > 0)
      this.#tokensPerEngineToken = snapshot.tokensPerEngineToken;
  }

  /** Requests in flight other than `request` whose first `depth` blocks are its own. */
  #sharing(request: RouteRequest, depth: number): number {
    if (depth <= 0) return 0;
    const last = request.blocks[depth - 1];
    let count = 0;
    for (const placed of this.#placed.values()) {
      const blocks = placed.request.blocks;
      if (placed.request.id !== request.id && blocks[depth - 1] === last) count += 1;
    }
    return count;
  }

  #matchedOn(request: RouteRequest, origin: string): number {
    return this.#index.match(request.blocks)[this.#index.slot(origin)] ?? 0;
  }

  /** The index's bound for an origin: its share of its KV cache, in blocks, capped. */
  #resize(slot: number): void {
    const kv = this.#kvTokens[slot] ?? null;
    const cap = this.settings.maxIndexBlocks;
    if (kv === null) return;
    const blocks = ((kv * this.#tokensPerEngineToken) / BLOCK_TOKENS) * (this.#share[slot] ?? 1);
    this.#index.setCapacity(slot, Math.min(cap, Math.max(BLOCK_TOKENS, blocks)));
  }
}

/** Cold placement's key: the session when there is one, else the first blocks' hash. */
export function coldKey(request: Pick<RouteRequest, "blocks" | "session" | "id">): number {
  if (request.session !== null) return stringHash(`s:${request.session}`);
  const { blocks } = request;
  if (blocks.length === 0) return stringHash(request.id);
  // Chained: the fourth block's hash names the first 64 tokens.
  return mix32(blocks[Math.min(blocks.length, COLD_KEY_BLOCKS) - 1] as number);
}

function stringHash(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) hash = Math.imul(hash ^ text.charCodeAt(i), 0x01000193);
  return mix32(hash);
}
