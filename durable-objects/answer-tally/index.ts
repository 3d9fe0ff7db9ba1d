/**
 * AnswerTally: the counts of every answer the edge gave (docs/metrics.md, "Every answer"),
 * by route group, status class and code, and the latest error answers. Each edge isolate
 * counts in memory and pushes its counts here in bulk, at most every few seconds, never
 * once per request; `/metrics` and the dashboard read every shard when asked.
 *
 * Tables: `answers` (route, status_class, code → count, a counter since the object began)
 * and `recent_errors` (the latest {@link TALLY_RECENT_ERRORS} error answers).
 */
import { DurableObject } from "cloudflare:workers";
import { applyMigrations } from "../migrations.ts";
import { type AnswerBatch, TALLY_RECENT_ERRORS } from "./types.ts";

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE answers (
     route TEXT NOT NULL, status_class TEXT NOT NULL, code TEXT NOT NULL, count INTEGER NOT NULL,
     PRIMARY KEY (route, status_class, code));
   CREATE TABLE recent_errors (
     request_id TEXT PRIMARY KEY, at INTEGER NOT NULL, status INTEGER NOT NULL,
     code TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL, model TEXT, key_id TEXT);
   CREATE INDEX recent_errors_at ON recent_errors (at);`,
];

type SeriesRow = { route: string; status_class: string; code: string; count: number };
type ErrorRow = {
  request_id: string;
  at: number;
  status: number;
  code: string;
  method: string;
  path: string;
  model: string | null;
  key_id: string | null;
};

export class AnswerTally extends DurableObject<Env> {
  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      applyMigrations(ctx.storage, MIGRATIONS);
    });
  }

  /** Adds an isolate's counts and error answers since its last push. */
  add(batch: AnswerBatch): void {
    const sql = this.ctx.storage.sql;
    this.ctx.storage.transactionSync(() => {
      for (const s of batch.series) {
        sql.exec(
          `INSERT INTO answers (route, status_class, code, count) VALUES (?, ?, ?, ?)
           ON CONFLICT (route, status_class, code) DO UPDATE SET count = count + excluded.count`,
          s.route,
          s.statusClass,
          s.code,
          s.count,
        );
      }
      for (const e of batch.errors.slice(-TALLY_RECENT_ERRORS)) {
        sql.exec(
          `INSERT OR REPLACE INTO recent_errors
             (request_id, at, status, code, method, path, model, key_id)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
          e.requestId,
          e.at,
          e.status,
          e.code,
          e.method,
          e.path,
          e.model,
          e.keyId,
        );
      }
      if (batch.errors.length > 0) {
        sql.exec(
          `DELETE FROM recent_errors WHERE request_id NOT IN
             (SELECT request_id FROM recent_errors ORDER BY at DESC LIMIT ?)`,
          TALLY_RECENT_ERRORS,
        );
      }
    });
  }

  /** Every series counted here and the latest error answers, newest first. */
  read(): AnswerBatch {
    const sql = this.ctx.storage.sql;
    const series = sql
      .exec<SeriesRow>("SELECT route, status_class, code, count FROM answers")
      .toArray()
      .map((r) => ({ route: r.route, statusClass: r.status_class, code: r.code, count: r.count }));
    const errors = sql
      .exec<ErrorRow>("SELECT * FROM recent_errors ORDER BY at DESC")
      .toArray()
      .map((r) => ({
        requestId: r.request_id,
        at: r.at,
        status: r.status,
        code: r.code,
        method: r.method,
        path: r.path,
        model: r.model,
        keyId: r.key_id,
      }));
    return { series, errors };
  }
}
