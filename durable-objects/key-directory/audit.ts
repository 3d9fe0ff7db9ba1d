/**
 * The admin audit log kept by the KeyDirectory (table `audit`): who did what to which
 * object, when, appended in the same transaction as the change it records, and read newest
 * first a page at a time (docs/key-account.md, "The audit log").
 */
import type { AuditActor, AuditEntry, AuditPage, AuditQuery } from "./types.ts";

/** The audit log's table. */
export const AUDIT_MIGRATION = `CREATE TABLE audit (
     seq INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, actor TEXT NOT NULL,
     action TEXT NOT NULL, target_type TEXT NOT NULL, target_id TEXT, detail TEXT NOT NULL);
   CREATE INDEX audit_by_target ON audit (target_id, seq);`;

/** The most entries kept: the oldest go first beyond it. */
export const AUDIT_KEPT = 100_000;

type AuditRow = {
  seq: number;
  at: number;
  actor: string;
  action: string;
  target_type: string;
  target_id: string | null;
  detail: string;
};

/** Appends one entry; call inside the transaction of the change it records. */
export function appendAudit(sql: SqlStorage, entry: AuditEntry): void {
  sql.exec(
    `INSERT INTO audit (at, actor, action, target_type, target_id, detail) VALUES (?, ?, ?, ?, ?, ?)`,
    entry.at,
    JSON.stringify(entry.actor),
    entry.action,
    entry.targetType,
    entry.targetId,
    entry.detail,
  );
  sql.exec("DELETE FROM audit WHERE seq <= (SELECT MAX(seq) FROM audit) - ?", AUDIT_KEPT);
}

/** A page of entries, newest first, before the entry `before` (exclusive) when given. */
export function auditPage(sql: SqlStorage, query: AuditQuery): AuditPage {
  const limit = Math.min(500, Math.max(1, Math.floor(query.limit)));
  const where: string[] = [];
  const args: (string | number)[] = [];
  if (query.before !== null) {
    where.push("seq < ?");
    args.push(query.before);
  }
  if (query.action !== null) {
    where.push("action = ?");
    args.push(query.action);
  }
  if (query.targetId !== null) {
    where.push("target_id = ?");
    args.push(query.targetId);
  }
  const rows = sql
    .exec<AuditRow>(
      `SELECT * FROM audit ${where.length === 0 ? "" : `WHERE ${where.join(" AND ")}`}
       ORDER BY seq DESC LIMIT ?`,
      ...args,
      limit + 1,
    )
    .toArray();
  return {
    entries: rows.slice(0, limit).map((row) => ({
      seq: row.seq,
      at: row.at,
      actor: JSON.parse(row.actor) as AuditActor,
      action: row.action,
      targetType: row.target_type,
      targetId: row.target_id,
      detail: row.detail,
    })),
    hasMore: rows.length > limit,
  };
}
