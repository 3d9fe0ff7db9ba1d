/**
 * The rate-limit buckets (table `buckets`): the key's, each end user's and each limited model's from first use,
 * loaded on first use and written behind (docs/key-account.md, "Storage").
 */
import type { WriteBehind } from "../../write-behind.ts";
import { KEY_SCOPE } from "../schema.ts";
import { type BucketState, adjust, fullBucket } from "../token-bucket.ts";

// An end user's buckets untouched this long are full again (or their debt is forgiven).
const IDLE_BUCKET_MS = 10 * 60_000;

/** A scope's buckets as last decided; null is a full bucket (never used, or idle and pruned). */
export interface ScopeState {
  requests: BucketState | null;
  tokens: BucketState | null;
}

/** One of a scope's two buckets. */
export type BucketKind = keyof ScopeState;

/** The buckets of every scope, memory ahead of SQLite. */
export class BucketStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  // By scope, loaded on first use; an end user's are dropped at pruning.
  readonly #scopes = new Map<string, ScopeState>();

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** A scope's buckets as last decided. */
  of(scope: string): ScopeState {
    const { requests, tokens } = this.#scope(scope);
    return { requests, tokens };
  }

  /** Stores a scope's buckets after a decision (a null one is left as it is). */
  put(scope: string, buckets: ScopeState): void {
    if (buckets.requests !== null) this.#put(scope, "requests", buckets.requests);
    if (buckets.tokens !== null) this.#put(scope, "tokens", buckets.tokens);
  }

  /** Moves `delta` token units into a scope's token bucket (see token-bucket.ts `adjust`). */
  adjustTokens(scope: string, capacity: number, delta: number, now: number): void {
    this.adjust(scope, "tokens", capacity, delta, now);
  }

  /** Moves `delta` units into one of a scope's buckets (a refund when positive). */
  adjust(scope: string, kind: BucketKind, capacity: number, delta: number, now: number): void {
    // A missing bucket is full: a refund has nowhere to go, a charge starts from full.
    const current = this.#scope(scope)[kind] ?? fullBucket(capacity, now);
    this.#put(scope, kind, adjust(current, capacity, delta, now));
  }

  /** Deletes the end users' buckets idle long enough to be full; the caller flushed. */
  prune(now: number): void {
    this.#sql.exec(
      "DELETE FROM buckets WHERE scope <> ? AND updated_at <= ?",
      KEY_SCOPE,
      now - IDLE_BUCKET_MS,
    );
    // Loaded again, on first use, from what is left.
    for (const scope of this.#scopes.keys()) {
      if (scope !== KEY_SCOPE) this.#scopes.delete(scope);
    }
  }

  /** When the longest-idle end user's buckets can be pruned; null when there are none. */
  prunableAt(): number | null {
    const at = this.#sql
      .exec<{ at: number | null }>(
        "SELECT MIN(updated_at) AS at FROM buckets WHERE scope <> ?",
        KEY_SCOPE,
      )
      .one().at;
    return at === null ? null : at + IDLE_BUCKET_MS;
  }

  // A scope's buckets, from SQLite the first time.
  #scope(scope: string): ScopeState {
    const cached = this.#scopes.get(scope);
    if (cached !== undefined) return cached;
    const state: ScopeState = { requests: null, tokens: null };
    for (const row of this.#sql.exec<{ kind: string; level: number; updated_at: number }>(
      "SELECT kind, level, updated_at FROM buckets WHERE scope = ?",
      scope,
    )) {
      const bucket = { level: row.level, updatedAt: row.updated_at };
      if (row.kind === "requests") state.requests = bucket;
      else state.tokens = bucket;
    }
    this.#scopes.set(scope, state);
    return state;
  }

  #put(scope: string, kind: BucketKind, bucket: BucketState): void {
    this.#scope(scope)[kind] = bucket;
    this.#writes.set(`bucket:${kind}:${scope}`, () =>
      this.#sql.exec(
        `INSERT INTO buckets (scope, kind, level, updated_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (scope, kind) DO UPDATE SET level = excluded.level, updated_at = excluded.updated_at`,
        scope,
        kind,
        bucket.level,
        bucket.updatedAt,
      ),
    );
  }
}
