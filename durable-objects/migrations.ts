/**
 * Schema migrations for Durable Object SQLite storage, tracked in `schema_migrations`
 * (version, applied_at): each pending step runs in its own transaction with its record,
 * so a crash between steps leaves the schema at a whole version.
 * See docs/key-account.md, "Storage".
 */

/**
 * Applies the migrations after the highest recorded version; `migrations[i]` is version
 * i + 1 and holds one or more SQL statements. Safe to call on every start.
 */
export function applyMigrations(
  storage: DurableObjectStorage,
  migrations: readonly string[],
): void {
  const sql = storage.sql;
  sql.exec(
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
  );
  const applied = sql
    .exec<{ v: number }>("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations")
    .one().v;
  for (let version = applied + 1; version <= migrations.length; version++) {
    const statements = migrations[version - 1];
    if (statements === undefined) break;
    storage.transactionSync(() => {
      sql.exec(statements);
      sql.exec(
        "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
        version,
        Date.now(),
      );
    });
  }
}
