/** The contract of the `KeyDirectory` (docs/key-account.md): its one instance's name and its audit log. */

/** The name of the single directory instance. */
export const DIRECTORY_NAME = "key-directory";

/** Who made an admin call. */
export interface AuditActor {
  /** The credential: `admin:` and the first 8 hex digits of the admin token's SHA-256. */
  credential: string;
  /** The name the caller declared in `x-warmgate-actor` (not verified), or null. */
  name: string | null;
  /** The caller's IP address (`cf-connecting-ip`), or null. */
  address: string | null;
}

/** One admin action as the audit log records it (times epoch ms). */
export interface AuditEntry {
  at: number;
  actor: AuditActor;
  /** What, as `<object>.<verb>`: `key.create`, `key.block`, `team.update`, … */
  action: string;
  targetType: string;
  targetId: string | null;
  /** The change as asked, as JSON text of an object (never a secret). */
  detail: string;
}

/** A stored audit entry: its sequence number is its cursor. */
export type AuditRecord = AuditEntry & { seq: number };

/** Which entries to read, newest first. */
export interface AuditQuery {
  limit: number;
  /** Only entries older than this sequence number. */
  before: number | null;
  action: string | null;
  targetId: string | null;
}

/** One page of the audit log. */
export interface AuditPage {
  entries: AuditRecord[];
  hasMore: boolean;
}
