/**
 * KeyDirectory: the index across API keys (docs/key-account.md, "The key directory"), for
 * listing keys and for answering CORS preflights with the union of active keys' origins.
 * Each KeyAccount stays the source of truth for its own key; the admin API copies every
 * change here, and a row is replaced only by a higher version.
 */
import { applyMigrations } from "../migrations.ts";
import { DurableObject } from "cloudflare:workers";
import type { KeyRecord } from "../key-account/types.ts";
import { AUDIT_MIGRATION, appendAudit, auditPage } from "./audit.ts";
import type { AuditEntry, AuditPage, AuditQuery } from "./types.ts";
import type { TeamRecord } from "../team-account/types.ts";
import { recordPage } from "./pages.ts";
import { TEAMS_MIGRATION, type TeamPage, putTeam, teamKeyIds, teamPage } from "./teams.ts";

/** One page of keys, newest first. */
export interface KeyPage {
  keys: KeyRecord[];
  hasMore: boolean;
}

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE keys (
     id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, version INTEGER NOT NULL,
     status TEXT NOT NULL, expires_at INTEGER, record TEXT NOT NULL);
   CREATE INDEX keys_by_created ON keys (created_at DESC, id DESC);
   CREATE TABLE key_origins (
     origin TEXT NOT NULL, key_id TEXT NOT NULL, PRIMARY KEY (origin, key_id));
   CREATE INDEX key_origins_by_key ON key_origins (key_id);`,
  AUDIT_MIGRATION,
  TEAMS_MIGRATION,
];

/** The index of all API keys. */
export class KeyDirectory extends DurableObject<Env> {
  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(() => this.#migrate());
  }

  /**
   * Records a key's latest state, and the admin action that made it in the audit log; an
   * older version than the stored one is ignored (its action is still recorded).
   */
  upsert(record: KeyRecord, audit?: AuditEntry): boolean {
    const sql = this.ctx.storage.sql;
    const stored = sql
      .exec<{ version: number }>("SELECT version FROM keys WHERE id = ?", record.id)
      .toArray()[0];
    if (stored !== undefined && stored.version > record.version) {
      if (audit !== undefined) this.log(audit);
      return false;
    }
    this.ctx.storage.transactionSync(() => {
      if (audit !== undefined) appendAudit(sql, audit);
      sql.exec(
        `INSERT INTO keys (id, created_at, version, status, expires_at, record) VALUES (?, ?, ?, ?, ?, ?)
         ON CONFLICT (id) DO UPDATE SET version = excluded.version, status = excluded.status,
           expires_at = excluded.expires_at, record = excluded.record`,
        record.id,
        record.createdAt,
        record.version,
        record.status,
        record.expiresAt,
        JSON.stringify(record),
      );
      sql.exec("DELETE FROM key_origins WHERE key_id = ?", record.id);
      for (const origin of new Set(record.allowedOrigins)) {
        sql.exec("INSERT INTO key_origins (origin, key_id) VALUES (?, ?)", origin, record.id);
      }
    });
    return true;
  }

  /** Appends one admin action to the audit log. */
  log(entry: AuditEntry): void {
    appendAudit(this.ctx.storage.sql, entry);
  }

  /** A page of the audit log, newest first. */
  audit(query: AuditQuery): AuditPage {
    return auditPage(this.ctx.storage.sql, query);
  }

  /** Every indexed key's id and name, oldest first (for fan-out reports such as usage). */
  ids(): { id: string; name: string }[] {
    return this.ctx.storage.sql
      .exec<{ id: string; record: string }>("SELECT id, record FROM keys ORDER BY created_at, id")
      .toArray()
      .map((row) => ({ id: row.id, name: (JSON.parse(row.record) as KeyRecord).name }));
  }

  /** Whether a key with this id is indexed. */
  has(id: string): boolean {
    return this.ctx.storage.sql.exec("SELECT 1 FROM keys WHERE id = ?", id).toArray().length > 0;
  }

  /** A page of keys, newest first, after the key `after` (exclusive) when given. */
  list(input: { limit: number; after?: string | null }): KeyPage {
    const { records, hasMore } = recordPage<KeyRecord>(this.ctx.storage.sql, "keys", input);
    return { keys: records, hasMore };
  }

  /** Records a team's latest state with the admin action that made it. */
  upsertTeam(record: TeamRecord, audit: AuditEntry): void {
    this.ctx.storage.transactionSync(() => {
      appendAudit(this.ctx.storage.sql, audit);
      putTeam(this.ctx.storage.sql, record);
    });
  }

  /** Whether a team with this id is indexed. */
  hasTeam(id: string): boolean {
    return this.ctx.storage.sql.exec("SELECT 1 FROM teams WHERE id = ?", id).toArray().length > 0;
  }

  /** A page of teams, newest first. */
  teams(input: { limit: number; after?: string | null }): TeamPage {
    return teamPage(this.ctx.storage.sql, input);
  }

  /** The ids of a team's keys (`active`: not revoked), oldest first. */
  teamKeys(teamId: string, active = false): string[] {
    return teamKeyIds(this.ctx.storage.sql, teamId, active);
  }

  /**
   * Removes a team from the index with its audit entry; refused (the ids of its keys
   * answered) while a key that is not revoked belongs to it.
   */
  removeTeam(id: string, audit: AuditEntry): { removed: boolean; keys: string[] } {
    const sql = this.ctx.storage.sql;
    const keys = teamKeyIds(sql, id, true);
    if (keys.length > 0) return { removed: false, keys };
    this.ctx.storage.transactionSync(() => {
      appendAudit(sql, audit);
      sql.exec("DELETE FROM teams WHERE id = ?", id);
    });
    return { removed: true, keys };
  }

  /** Whether any active, unexpired key allows this browser origin. */
  originAllowed(origin: string, now: number): boolean {
    return (
      this.ctx.storage.sql
        .exec(
          `SELECT 1 FROM key_origins o JOIN keys k ON k.id = o.key_id
           WHERE o.origin = ? AND k.status <> 'revoked' AND (k.expires_at IS NULL OR k.expires_at > ?)
           LIMIT 1`,
          origin,
          now,
        )
        .toArray().length > 0
    );
  }

  async #migrate(): Promise<void> {
    applyMigrations(this.ctx.storage, MIGRATIONS);
  }
}
