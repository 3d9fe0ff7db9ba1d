/**
 * The ledger (table `ledger`): every open row in memory (loaded at start), the requests
 * whose lease lapsed unsettled and the ended leases whose ids are still asked about, and
 * each row's latest state written behind
 * (docs/key-account.md, "Storage" and "Leases and reconciliation").
 */
import { LEDGER_RETENTION_MS } from "../types.ts";
import type { WriteBehind } from "../../write-behind.ts";
import {
  LEDGER_COLUMNS,
  type LedgerEntry,
  type LedgerRow,
  type UsageDbRow,
  ledgerEntryOf,
  picosColumns,
  usageRowOf,
} from "../schema.ts";
import { type RequestLogQuery, type TagUsageRow, type UsageRow } from "../usage-types.ts";

const USAGE_SUMS = `COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,
  COALESCE(SUM(cached_tokens), 0) AS cached_tokens,
  COALESCE(SUM(completion_tokens), 0) AS completion_tokens,
  COALESCE(SUM(cost_micros), 0) AS cost_micros, COALESCE(SUM(cost_picos), 0) AS cost_picos`;

/**
 * How long after its lease lapsed a request is still looked for on the origins (they
 * remember items for 15 minutes).
 */
const RECONCILE_WINDOW_MS = 10 * 60_000;

/** The key's ledger rows: the open ones in memory ahead of SQLite, every one in SQLite. */
export class LedgerStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  // Open rows: every request in flight.
  readonly #open = new Map<string, LedgerEntry>();
  // Open rows per end-user subject of browser tokens, for their concurrency limit.
  readonly #openBySubject = new Map<string, number>();
  // No open row expires before this (exact after each scan, a lower bound after a settle).
  #nextExpiry = Number.POSITIVE_INFINITY;
  // Requests whose lease lapsed unsettled, to look up on the origins: id → when it lapsed.
  readonly #lapsed = new Map<string, number>();
  // Ended leases whose ids may name requests never settled, looked up by the ids' prefix
  // (the lease's range, never its ids one by one): lease id → when it ended.
  readonly #lapsedLeases = new Map<string, number>();

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** Loads the open rows, and the lapsed ones still to reconcile (at start). */
  load(now: number): void {
    for (const row of this.#sql.exec<LedgerRow>(
      `SELECT ${LEDGER_COLUMNS} FROM ledger WHERE state = 'open'`,
    )) {
      this.#track(ledgerEntryOf(row));
    }
    for (const row of this.#sql.exec<{ request_id: string; closed_at: number }>(
      "SELECT request_id, closed_at FROM ledger WHERE state = 'expired' AND closed_at > ?",
      now - RECONCILE_WINDOW_MS,
    )) {
      this.#lapsed.set(row.request_id, row.closed_at);
    }
  }

  /** The open row of a request in flight, if any. */
  openRow(requestId: string): LedgerEntry | undefined {
    return this.#open.get(requestId);
  }

  /** Requests in flight: the key's (`subject` null) or one end user's. */
  inFlight(subject: string | null): number {
    return subject === null ? this.#open.size : (this.#openBySubject.get(subject) ?? 0);
  }

  /** Opens an admitted request's row. */
  open(entry: LedgerEntry): void {
    this.#track(entry);
    this.#put(entry);
  }

  /** Writes a row closed (settled or expired); `before` leaves the open rows if it was one. */
  close(before: LedgerEntry, after: LedgerEntry): void {
    this.#untrack(before);
    this.#put(after);
  }

  /** Writes a row that is closed already (a batch line billed); a row known is left as it is. */
  add(entry: LedgerEntry): void {
    this.#put(entry);
  }

  /** Extends an open row's lease to `expiresAt`, never shortening it; false when not open. */
  renew(requestId: string, expiresAt: number): boolean {
    const row = this.#open.get(requestId);
    if (row === undefined) return false;
    if (row.expiresAt >= expiresAt) return true;
    row.expiresAt = expiresAt;
    this.#put(row);
    return true;
  }

  /**
   * The open rows whose lease ran out by `now` (none before the earliest lease ends), to
   * close; the earliest lease of the others is then exact.
   */
  expiring(now: number): LedgerEntry[] {
    if (now < this.#nextExpiry) return [];
    let next = Number.POSITIVE_INFINITY;
    const due: LedgerEntry[] = [];
    for (const row of this.#open.values()) {
      if (row.expiresAt > now) next = Math.min(next, row.expiresAt);
      else due.push(row);
    }
    this.#nextExpiry = next;
    return due;
  }

  /** When the first open lease ends (infinity when none), made exact again. */
  earliestLease(): number {
    let open = Number.POSITIVE_INFINITY;
    for (const row of this.#open.values()) open = Math.min(open, row.expiresAt);
    this.#nextExpiry = open;
    return open;
  }

  /**
   * A request's row as committed (a flush first when a write of that row waits); null when
   * unknown or pruned. Other queued writes cannot change the row: they stay queued, so a
   * call settling many requests commits once.
   */
  committed(requestId: string): LedgerEntry | null {
    if (this.#writes.has(ledgerKey(requestId))) this.#writes.flush();
    const row = this.#sql
      .exec<LedgerRow>(`SELECT ${LEDGER_COLUMNS} FROM ledger WHERE request_id = ?`, requestId)
      .toArray()[0];
    return row === undefined ? null : ledgerEntryOf(row);
  }

  /** Asks the origins about a request whose usage is unknown, from `at` (kept if earlier). */
  lapse(requestId: string, at: number): void {
    this.#lapsed.set(requestId, this.#lapsed.get(requestId) ?? at);
  }

  /**
   * Asks the origins, from `at` (kept if earlier), about every request an ended lease may
   * have named without a ledger row: one entry for the lease, however many ids it had.
   */
  lapseLease(leaseId: string, at: number): void {
    this.#lapsedLeases.set(leaseId, this.#lapsedLeases.get(leaseId) ?? at);
  }

  /** Stops asking about a lapsed request: it was settled, or the origins know it no more. */
  resolve(requestId: string): void {
    this.#lapsed.delete(requestId);
  }

  /** Stops asking about an ended lease's requests: none still runs on an origin. */
  resolveLease(leaseId: string): void {
    this.#lapsedLeases.delete(leaseId);
  }

  /** Whether a lapsed request or lease is still to be asked about. */
  get hasLapsed(): boolean {
    return this.#lapsed.size > 0 || this.#lapsedLeases.size > 0;
  }

  /** How many lapsed requests, and ended leases, are still to be asked about. */
  lapsedCount(): { requests: number; leases: number } {
    return { requests: this.#lapsed.size, leases: this.#lapsedLeases.size };
  }

  /**
   * Up to `maxIds` lapsed requests and `maxLeases` ended leases to ask about: the requests
   * past the window first, asked this last time (`last`) and dropped (those over `maxIds`
   * at a later ask); leases past it dropped.
   */
  lapsedToAsk(
    now: number,
    maxIds: number,
    maxLeases: number,
  ): { requestIds: string[]; leaseIds: string[]; last: Set<string> } {
    const last = new Set<string>();
    for (const [id, lapsedAt] of this.#lapsed) {
      if (lapsedAt + RECONCILE_WINDOW_MS > now || last.size >= maxIds) continue;
      this.#lapsed.delete(id);
      last.add(id);
    }
    for (const [id, lapsedAt] of this.#lapsedLeases) {
      if (lapsedAt + RECONCILE_WINDOW_MS <= now) this.#lapsedLeases.delete(id);
    }
    return {
      requestIds: [...last, ...firstKeys(this.#lapsed, maxIds - last.size)],
      leaseIds: firstKeys(this.#lapsedLeases, maxLeases),
      last,
    };
  }

  /**
   * Usage by day and model of one end user's requests, one tag's or one team's, or of
   * several of them, summed from the closed rows (a flush first).
   */
  filteredUsage(
    only: { user?: string; tag?: string; teamId?: string },
    from: string,
    to: string,
  ): UsageRow[] {
    this.#writes.flush();
    const where = ["day >= ?", "day <= ?", "state <> 'open'"];
    const args: string[] = [from, to];
    if (only.user !== undefined) {
      where.push("end_user = ?");
      args.push(only.user);
    }
    if (only.tag !== undefined) {
      where.push("EXISTS (SELECT 1 FROM json_each(ledger.tags) WHERE value = ?)");
      args.push(only.tag);
    }
    if (only.teamId !== undefined) {
      where.push("team_id = ?");
      args.push(only.teamId);
    }
    return this.#sql
      .exec<UsageDbRow>(
        `SELECT day, model, COUNT(*) AS requests, ${USAGE_SUMS}
         FROM ledger WHERE ${where.join(" AND ")} GROUP BY day, model ORDER BY day, model`,
        ...args,
      )
      .toArray()
      .map(usageRowOf);
  }

  /** Totals per tag of the closed rows from `from` to `to` (UTC days), from the ledger. */
  tagUsage(from: string, to: string): TagUsageRow[] {
    this.#writes.flush();
    return this.#sql
      .exec<UsageDbRow & { tag: string }>(
        `SELECT t.value AS tag, '' AS day, '' AS model, COUNT(*) AS requests, ${USAGE_SUMS}
         FROM ledger, json_each(ledger.tags) AS t
         WHERE day >= ? AND day <= ? AND state <> 'open' GROUP BY t.value ORDER BY t.value`,
        from,
        to,
      )
      .toArray()
      .map(({ tag, ...row }) => {
        const { day: _day, model: _model, ...totals } = usageRowOf(row);
        return { tag, ...totals };
      });
  }

  /** A page of rows newest first (a flush first): the spend log's (docs/api.md). */
  page(query: RequestLogQuery): LedgerEntry[] {
    this.#writes.flush();
    const where = ["created_at >= ?", "created_at < ?"];
    const args: (string | number)[] = [query.from, query.to];
    if (query.before !== undefined) {
      where.push("(created_at < ? OR (created_at = ? AND request_id < ?))");
      const { createdAt, requestId } = query.before;
      args.push(createdAt, createdAt, requestId);
    }
    const equal: [string, string | undefined][] = [
      ["end_user", query.user],
      ["model", query.model],
      ["team_id", query.teamId],
      ["state", query.status],
      ["outcome", query.outcome],
    ];
    for (const [column, value] of equal) {
      if (value === undefined) continue;
      where.push(`${column} = ?`);
      args.push(value);
    }
    if (query.tag !== undefined) {
      where.push("EXISTS (SELECT 1 FROM json_each(ledger.tags) WHERE value = ?)");
      args.push(query.tag);
    }
    return this.#sql
      .exec<LedgerRow>(
        `SELECT ${LEDGER_COLUMNS} FROM ledger WHERE ${where.join(" AND ")}
         ORDER BY created_at DESC, request_id DESC LIMIT ?`,
        ...args,
        // The spend log asks one row more than its page (500 at most), to know if more follow.
        Math.min(501, Math.max(1, Math.floor(query.limit))),
      )
      .toArray()
      .map(ledgerEntryOf);
  }

  /** Deletes the closed rows past their retention; the caller flushed. */
  prune(now: number): void {
    this.#sql.exec(
      "DELETE FROM ledger WHERE state <> 'open' AND closed_at <= ?",
      now - LEDGER_RETENTION_MS,
    );
  }

  /** When the oldest closed row can be pruned; null when there is none. */
  prunableAt(): number | null {
    const at = this.#sql
      .exec<{ at: number | null }>("SELECT MIN(closed_at) AS at FROM ledger WHERE state <> 'open'")
      .one().at;
    return at === null ? null : at + LEDGER_RETENTION_MS;
  }

  #track(entry: LedgerEntry): void {
    this.#open.set(entry.requestId, entry);
    if (entry.subject !== null) {
      this.#openBySubject.set(entry.subject, (this.#openBySubject.get(entry.subject) ?? 0) + 1);
    }
    this.#nextExpiry = Math.min(this.#nextExpiry, entry.expiresAt);
  }

  // Forgets an open row (a no-op for a row that is not in flight here).
  #untrack(entry: LedgerEntry): void {
    if (!this.#open.delete(entry.requestId) || entry.subject === null) return;
    const left = (this.#openBySubject.get(entry.subject) ?? 1) - 1;
    if (left > 0) this.#openBySubject.set(entry.subject, left);
    else this.#openBySubject.delete(entry.subject);
  }

  // Queues the row's whole current state: an admit and its settlement within one write
  // window are one INSERT. A write only moves a row forward (open → settled | expired,
  // expired → settled), so a stale or repeated one cannot reopen or rebill a closed row.
  #put(entry: LedgerEntry): void {
    this.#writes.set(ledgerKey(entry.requestId), () =>
      this.#sql.exec(
        `INSERT INTO ledger (${LEDGER_COLUMNS})
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (request_id) DO UPDATE SET state = excluded.state, model = excluded.model,
           closed_at = excluded.closed_at, outcome = excluded.outcome,
           prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens,
           completion_tokens = excluded.completion_tokens, cost_micros = excluded.cost_micros,
           cost_picos = excluded.cost_picos, expires_at = excluded.expires_at, attempts = excluded.attempts,
           http_status = excluded.http_status, duration_ms = excluded.duration_ms,
           ttft_ms = excluded.ttft_ms,
           cache_hit = excluded.cache_hit
         WHERE ledger.state = 'open' OR (ledger.state = 'expired' AND excluded.state <> 'open')`,
        entry.requestId,
        entry.state,
        entry.model,
        entry.day,
        entry.subject,
        entry.subjectTpm,
        entry.endUser,
        entry.reservedTokens,
        ...picosColumns(entry.reservedPicos),
        JSON.stringify(entry.candidates),
        entry.createdAt,
        entry.expiresAt,
        entry.closedAt,
        entry.outcome,
        entry.promptTokens,
        entry.cachedTokens,
        entry.completionTokens,
        ...picosColumns(entry.costPicos),
        JSON.stringify(entry.attempts),
        JSON.stringify(entry.tags),
        entry.httpStatus,
        entry.durationMs,
        entry.ttftMs,
        entry.cacheHit ? 1 : 0,
        entry.hour,
        entry.teamId,
      ),
    );
  }
}

// The first `max` keys of a map, in insertion order.
function firstKeys(map: Map<string, unknown>, max: number): string[] {
  const keys: string[] = [];
  for (const key of map.keys()) {
    if (keys.length >= max) break;
    keys.push(key);
  }
  return keys;
}

// The write-behind key of a request's row.
function ledgerKey(requestId: string): string {
  return `ledger:${requestId}`;
}
