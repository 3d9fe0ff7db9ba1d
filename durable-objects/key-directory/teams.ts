/**
 * The teams the KeyDirectory indexes (table `teams`, docs/key-account.md, "Teams"): each
 * team's latest record, for listing teams, checking a key's `team_id`, and refusing to
 * delete a team that still has keys. Each TeamAccount stays the source of truth.
 */
import type { TeamRecord } from "../team-account/types.ts";
import { recordPage } from "./pages.ts";

/** The teams table. */
export const TEAMS_MIGRATION = `CREATE TABLE teams (
     id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, version INTEGER NOT NULL,
     record TEXT NOT NULL);
   CREATE INDEX teams_by_created ON teams (created_at DESC, id DESC);`;

/** One page of teams, newest first. */
export interface TeamPage {
  teams: TeamRecord[];
  hasMore: boolean;
}

/** Records a team's latest state; an older version than the stored one is ignored. */
export function putTeam(sql: SqlStorage, record: TeamRecord): void {
  sql.exec(
    `INSERT INTO teams (id, created_at, version, record) VALUES (?, ?, ?, ?)
     ON CONFLICT (id) DO UPDATE SET version = excluded.version, record = excluded.record
     WHERE excluded.version > teams.version`,
    record.id,
    record.createdAt,
    record.version,
    JSON.stringify(record),
  );
}

/** The ids of the keys in a team; `active`: only those not revoked. */
export function teamKeyIds(sql: SqlStorage, teamId: string, active: boolean): string[] {
  return sql
    .exec<{ id: string }>(
      `SELECT id FROM keys WHERE json_extract(record, '$.teamId') = ?
       ${active ? "AND status <> 'revoked'" : ""} ORDER BY created_at, id`,
      teamId,
    )
    .toArray()
    .map((row) => row.id);
}

/** A page of teams, newest first, after the team `after` (exclusive) when given. */
export function teamPage(
  sql: SqlStorage,
  input: { limit: number; after?: string | null },
): TeamPage {
  const { records, hasMore } = recordPage<TeamRecord>(sql, "teams", input);
  return { teams: records, hasMore };
}
