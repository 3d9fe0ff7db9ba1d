/**
 * A batch's storage (docs/batch-api.md, "Storage"): the `batch` row and one `lines` row per
 * input line, every SQL statement the object runs. Writes are synchronous SQLite calls,
 * durable before the object's next outgoing message (the output gate).
 */
import type { TokenUsage } from "../../contracts/pricing.ts";
import { applyMigrations } from "../migrations.ts";
import type { BatchState, LineCounts } from "./lifecycle.ts";
import type { BatchCreateInput, BatchRunPlan, BatchStatus, LineToRun } from "./types.ts";

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE batch (
     id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL, run TEXT NOT NULL,
     next_charge INTEGER NOT NULL DEFAULT 1);
   CREATE TABLE lines (
     idx INTEGER PRIMARY KEY, custom_id TEXT NOT NULL, offset INTEGER NOT NULL,
     bytes INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, max_tokens INTEGER NOT NULL,
     reserve_picos TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
     ok INTEGER, record TEXT, cost_picos TEXT, usage TEXT, charge INTEGER);
   CREATE INDEX lines_by_state ON lines (state, idx);
   CREATE INDEX lines_by_custom_id ON lines (custom_id);
   CREATE INDEX lines_by_charge ON lines (charge);`,
  // Lines grouped by prefix when sent; each line's times and status for its ledger row.
  `ALTER TABLE lines ADD COLUMN prefix INTEGER;
   ALTER TABLE lines ADD COLUMN started_at INTEGER;
   ALTER TABLE lines ADD COLUMN ended_at INTEGER;
   ALTER TABLE lines ADD COLUMN http_status INTEGER;
   CREATE INDEX lines_by_prefix ON lines (state, prefix, idx);`,
  // Ended lines not charged yet, found without reading the pending ones.
  `CREATE INDEX lines_by_state_charge ON lines (state, charge);`,
  // Every lookup by state is served by an index that leads with it: one fewer to update at
  // every move of a line.
  `DROP INDEX lines_by_state;`,
  // The origin that answered each line, for its ledger row.
  `ALTER TABLE lines ADD COLUMN origin TEXT;`,
];

/** The states a line moves through. */
type LineState = "pending" | "running" | "ok" | "failed";

/** A finished line's part in a charge. */
export interface ChargedLine {
  /** Its index in the input file. */
  idx: number;
  ok: boolean;
  /** The status its origin answered and that origin; null when it never ran. */
  httpStatus: number | null;
  origin: string | null;
  /** When its last attempt was sent (null: never) and when it ended, unix ms. */
  startedAt: number | null;
  endedAt: number | null;
  costPicos: bigint;
  releasePicos: bigint;
  usage: TokenUsage | null;
}

/** One batch's rows. */
export class BatchStore {
  readonly #sql: SqlStorage;
  #state: BatchState | null = null;
  #owner = "";
  #run: BatchRunPlan | null = null;
  /** Lines in each state, kept as the lines move (read from the table once). */
  #counts: LineCounts | null = null;

  constructor(storage: DurableObjectStorage) {
    applyMigrations(storage, MIGRATIONS);
    this.#sql = storage.sql;
    const row = this.#sql
      .exec<{ owner: string; state: string; run: string }>("SELECT owner, state, run FROM batch")
      .toArray()[0];
    if (row !== undefined) {
      this.#owner = row.owner;
      this.#state = JSON.parse(row.state) as BatchState;
      this.#run = JSON.parse(row.run) as BatchRunPlan;
    }
  }

  /** The batch, null before `create`. */
  get state(): BatchState | null {
    return this.#state;
  }

  get owner(): string {
    return this.#owner;
  }

  /** How its lines are run (set with the batch). */
  get run(): BatchRunPlan {
    if (this.#run === null) throw new Error("batch not created");
    return this.#run;
  }

  /** Stores a new batch and its lines, every line pending. */
  create(input: BatchCreateInput, state: BatchState): void {
    this.#sql.exec(
      "INSERT INTO batch (id, owner, state, run) VALUES (?, ?, ?, ?)",
      input.id,
      input.owner,
      JSON.stringify(state),
      JSON.stringify(input.run),
    );
    for (const [idx, line] of input.lines.entries()) {
      this.#sql.exec(
        `INSERT INTO lines (idx, custom_id, prefix, offset, bytes, prompt_tokens, max_tokens,
           reserve_picos, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending')`,
        idx,
        line.customId,
        line.prefix,
        line.offset,
        line.bytes,
        line.promptTokens,
        line.maxTokens,
        line.reservePicos.toString(),
      );
    }
    this.#owner = input.owner;
    this.#state = state;
    this.#run = input.run;
    this.#counts = null;
  }

  /** Replaces the batch's state (a new status, a file id). */
  update(change: Partial<BatchState> & { status?: BatchStatus }): BatchState {
    if (this.#state === null) throw new Error("batch not created");
    this.#state = { ...this.#state, ...change };
    this.#sql.exec("UPDATE batch SET state = ?", JSON.stringify(this.#state));
    return this.#state;
  }

  /** Lines in each state. */
  counts(): LineCounts {
    if (this.#counts === null) this.#counts = this.#countRows();
    return { ...this.#counts };
  }

  #countRows(): LineCounts {
    const counts: LineCounts = { total: 0, pending: 0, running: 0, ok: 0, failed: 0 };
    for (const row of this.#sql.exec<{ state: string; n: number }>(
      "SELECT state, COUNT(*) AS n FROM lines GROUP BY state",
    )) {
      counts.total += row.n;
      if (row.state === "pending") counts.pending = row.n;
      else if (row.state === "running") counts.running = row.n;
      else if (row.state === "ok") counts.ok = row.n;
      else counts.failed += row.n;
    }
    return counts;
  }

  /** Moves one line's count from state `from` to state `to` (when the counts are read). */
  #move(from: LineState, to: LineState): void {
    if (this.#counts === null) return;
    this.#counts[from] -= 1;
    this.#counts[to] += 1;
  }

  /**
   * Marks up to `limit` pending lines running (durably, before any is sent) and returns them,
   * those sharing a prefix together, so that they reach the origin that holds it together.
   */
  startLines(limit: number, now: number): LineToRun[] {
    if (limit <= 0) return [];
    const rows = this.#sql
      .exec<{
        idx: number;
        custom_id: string;
        prefix: number | null;
        offset: number;
        bytes: number;
        prompt_tokens: number;
        max_tokens: number;
      }>(
        `SELECT idx, custom_id, prefix, offset, bytes, prompt_tokens, max_tokens FROM lines
         WHERE state = 'pending' ORDER BY prefix, idx LIMIT ?`,
        limit,
      )
      .toArray();
    for (const row of rows) {
      this.#sql.exec(
        "UPDATE lines SET state = 'running', attempts = attempts + 1, started_at = ? WHERE idx = ?",
        now,
        row.idx,
      );
      this.#move("pending", "running");
    }
    return rows.map((row) => ({
      idx: row.idx,
      customId: row.custom_id,
      prefix: row.prefix,
      offset: row.offset,
      bytes: row.bytes,
      promptTokens: row.prompt_tokens,
      maxTokens: row.max_tokens,
    }));
  }

  /** Lines marked running by an earlier incarnation go back to pending (their ids stay). */
  requeueRunning(except: ReadonlySet<number>): number[] {
    const requeued: number[] = [];
    for (const { idx } of this.#sql.exec<{ idx: number }>(
      "SELECT idx FROM lines WHERE state = 'running'",
    )) {
      if (except.has(idx)) continue;
      this.#sql.exec("UPDATE lines SET state = 'pending' WHERE idx = ?", idx);
      this.#move("running", "pending");
      requeued.push(idx);
    }
    return requeued;
  }

  /** Puts a running line back to pending (it will be sent again under the same id). */
  release(idx: number): void {
    const { rowsWritten } = this.#sql.exec(
      "UPDATE lines SET state = 'pending' WHERE idx = ? AND state = 'running'",
      idx,
    );
    if (rowsWritten > 0) this.#move("running", "pending");
  }

  /**
   * Records a line's end once: its output record, the status its origin answered and that
   * origin (null when it never ran), and its cost when it is billed.
   */
  finish(
    idx: number,
    end: {
      ok: boolean;
      record: string;
      httpStatus: number | null;
      /** The origin that answered; none when it never ran. */
      origin?: string;
      now: number;
    },
    bill: { costPicos: bigint; usage: TokenUsage | null } | null,
  ): void {
    const { ok, record } = end;
    const to: LineState = ok ? "ok" : "failed";
    const values = [
      to,
      ok ? 1 : 0,
      record,
      end.httpStatus,
      end.origin ?? null,
      end.now,
      (bill?.costPicos ?? 0n).toString(),
      bill?.usage === null || bill === null ? null : JSON.stringify(bill.usage),
      idx,
    ];
    // A line ends running nearly always: that update first, the pending one only if it
    // wrote nothing; a line that ended already is left as it is.
    for (const from of ["running", "pending"] as const) {
      const written = this.#sql.exec(
        `UPDATE lines SET state = ?, ok = ?, record = ?, http_status = ?, origin = ?, ended_at = ?,
           cost_picos = ?, usage = ?
         WHERE idx = ? AND state = '${from}'`,
        ...values,
      ).rowsWritten;
      if (written > 0) {
        this.#move(from, to);
        return;
      }
    }
  }

  /** Ended lines not in a charge yet. */
  uncharged(): number {
    return this.#sql
      .exec<{ n: number }>(
        "SELECT COUNT(*) AS n FROM lines WHERE state IN ('ok', 'failed') AND charge IS NULL",
      )
      .one().n;
  }

  /** Every pending line, for failing them all (expiry, cancel). */
  pendingLines(): { idx: number; customId: string }[] {
    return this.#sql
      .exec<{ idx: number; custom_id: string }>(
        "SELECT idx, custom_id FROM lines WHERE state = 'pending' ORDER BY idx",
      )
      .toArray()
      .map((row) => ({ idx: row.idx, customId: row.custom_id }));
  }

  /**
   * The charge to send next: the one sent before and not confirmed, or a new one holding
   * every ended line not charged yet; null when there is nothing to charge.
   */
  nextCharge(): { seq: number; lines: ChargedLine[] } | null {
    const next = this.#sql.exec<{ next_charge: number }>("SELECT next_charge FROM batch").one();
    const seq = next.next_charge;
    // A charge's lines are fixed once assigned: one sent but not confirmed is sent again as it was.
    const assigned = this.#sql
      .exec<{ n: number }>("SELECT COUNT(*) AS n FROM lines WHERE charge = ?", seq)
      .one().n;
    if (assigned === 0) {
      this.#sql.exec(
        "UPDATE lines SET charge = ? WHERE charge IS NULL AND state IN ('ok', 'failed')",
        seq,
      );
    }
    const lines = this.#sql
      .exec<{
        idx: number;
        ok: number;
        http_status: number | null;
        origin: string | null;
        started_at: number | null;
        ended_at: number | null;
        cost_picos: string;
        reserve_picos: string;
        usage: string | null;
      }>(
        `SELECT idx, ok, http_status, origin, started_at, ended_at, cost_picos, reserve_picos, usage
         FROM lines WHERE charge = ? ORDER BY idx`,
        seq,
      )
      .toArray()
      .map((row) => ({
        idx: row.idx,
        ok: row.ok === 1,
        httpStatus: row.http_status,
        origin: row.origin,
        startedAt: row.started_at,
        endedAt: row.ended_at,
        costPicos: BigInt(row.cost_picos),
        releasePicos: BigInt(row.reserve_picos),
        usage: row.usage === null ? null : (JSON.parse(row.usage) as TokenUsage),
      }));
    return lines.length === 0 ? null : { seq, lines };
  }

  /** The charge `seq` was applied by the key's account: the next one gets a new number. */
  charged(seq: number): void {
    this.#sql.exec("UPDATE batch SET next_charge = ? WHERE next_charge = ?", seq + 1, seq);
  }

  /**
   * Up to `limit` ended lines' records after custom id `after` (custom ids are unique in a
   * batch), in custom id order: the `ok` ones or the failed ones.
   */
  records(
    ok: boolean,
    after: string | null,
    limit: number,
  ): { customId: string; record: string }[] {
    return this.#sql
      .exec<{ custom_id: string; record: string }>(
        `SELECT custom_id, record FROM lines WHERE ok = ? AND custom_id > ?
         ORDER BY custom_id LIMIT ?`,
        ok ? 1 : 0,
        after ?? "",
        limit,
      )
      .toArray()
      .map((row) => ({ customId: row.custom_id, record: row.record }));
  }

  /** Bytes of the file of `ok` (or failed) records, one per line with its newline. */
  recordBytes(ok: boolean): number {
    return (
      this.#sql
        .exec<{ bytes: number | null }>(
          "SELECT SUM(length(CAST(record AS BLOB)) + 1) AS bytes FROM lines WHERE ok = ?",
          ok ? 1 : 0,
        )
        .one().bytes ?? 0
    );
  }
}
