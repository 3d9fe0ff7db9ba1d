/**
 * Newest-first pages of the records the KeyDirectory indexes (keys and teams, each a table
 * with `id`, `created_at` and the record as JSON), after a record (exclusive) when given
 * (docs/api.md, admin list routes).
 */

/** One page of records, newest first, and whether more follow. */
export interface RecordPage<T> {
  records: T[];
  hasMore: boolean;
}

/** Up to `limit` (1–100) records of `table` after the record `after`. */
export function recordPage<T>(
  sql: SqlStorage,
  table: "keys" | "teams",
  input: { limit: number; after?: string | null },
): RecordPage<T> {
  const limit = Math.min(100, Math.max(1, Math.floor(input.limit)));
  const after = input.after ?? null;
  const cursor =
    after === null
      ? undefined
      : sql
          .exec<{ created_at: number }>(`SELECT created_at FROM ${table} WHERE id = ?`, after)
          .toArray()[0];
  if (after !== null && cursor === undefined) return { records: [], hasMore: false };
  const rows = (
    cursor === undefined
      ? sql.exec<{ record: string }>(
          `SELECT record FROM ${table} ORDER BY created_at DESC, id DESC LIMIT ?`,
          limit + 1,
        )
      : sql.exec<{ record: string }>(
          `SELECT record FROM ${table} WHERE (created_at, id) < (?, ?)
           ORDER BY created_at DESC, id DESC LIMIT ?`,
          cursor.created_at,
          after,
          limit + 1,
        )
  ).toArray();
  return {
    records: rows.slice(0, limit).map((row) => JSON.parse(row.record) as T),
    hasMore: rows.length > limit,
  };
}
