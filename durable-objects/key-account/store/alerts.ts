/**
 * The key's soft-budget alerts (table `budget_alerts`, docs/key-account.md, "Soft budgets
 * and alerts"): one row per budget window whose soft limit was crossed, with its body and
 * how its delivery stands, written behind like the settlement that crossed it.
 */
import type { WriteBehind } from "../../write-behind.ts";

// Alerts are kept this long after their window began: long past any retry.
const ALERT_RETENTION_MS = 62 * 86_400_000;

/** An alert as the account holds it. */
export interface AlertEntry {
  /** `<scope>:<period>:<first hour of the window>`: one alert per window crossed. */
  alertId: string;
  scope: string;
  period: string;
  windowStart: number;
  /** The JSON body sent, fixed when the alert was raised. */
  body: string;
  /** Where it goes (the key's webhook, else the configuration's), or null: nowhere. */
  url: string | null;
  attempts: number;
  /** When its next attempt is due; null once delivered or dropped. */
  nextAt: number | null;
  deliveredAt: number | null;
  createdAt: number;
}

type AlertRow = {
  alert_id: string;
  scope: string;
  period: string;
  window_start: number;
  body: string;
  url: string | null;
  attempts: number;
  next_at: number | null;
  delivered_at: number | null;
  created_at: number;
};

/** The key's alerts, memory ahead of SQLite: every alert kept, by id. */
export class AlertStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  readonly #alerts = new Map<string, AlertEntry>();

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** Loads the alerts kept (at start). */
  load(): void {
    for (const row of this.#sql.exec<AlertRow>("SELECT * FROM budget_alerts")) {
      this.#alerts.set(row.alert_id, alertOf(row));
    }
  }

  /** Whether an alert was raised for this id already. */
  has(alertId: string): boolean {
    return this.#alerts.has(alertId);
  }

  /** The alerts whose next attempt is due by `now`. */
  due(now: number): AlertEntry[] {
    return [...this.#alerts.values()].filter((a) => a.nextAt !== null && a.nextAt <= now);
  }

  /** When the next attempt is due (infinity when none). */
  nextDue(): number {
    let next = Number.POSITIVE_INFINITY;
    for (const alert of this.#alerts.values()) {
      if (alert.nextAt !== null) next = Math.min(next, alert.nextAt);
    }
    return next;
  }

  /** Stores an alert's current state (written behind). */
  put(alert: AlertEntry): void {
    this.#alerts.set(alert.alertId, alert);
    this.#writes.set(`alert:${alert.alertId}`, () =>
      this.#sql.exec(
        `INSERT OR REPLACE INTO budget_alerts (alert_id, scope, period, window_start, body, url,
           attempts, next_at, delivered_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        alert.alertId,
        alert.scope,
        alert.period,
        alert.windowStart,
        alert.body,
        alert.url,
        alert.attempts,
        alert.nextAt,
        alert.deliveredAt,
        alert.createdAt,
      ),
    );
  }

  /** Deletes the alerts of windows long past; the caller flushed. */
  prune(now: number): void {
    const before = now - ALERT_RETENTION_MS;
    for (const alert of this.#alerts.values()) {
      if (alert.nextAt === null && alert.createdAt < before) this.#alerts.delete(alert.alertId);
    }
    this.#sql.exec("DELETE FROM budget_alerts WHERE next_at IS NULL AND created_at < ?", before);
  }
}

function alertOf(row: AlertRow): AlertEntry {
  return {
    alertId: row.alert_id,
    scope: row.scope,
    period: row.period,
    windowStart: row.window_start,
    body: row.body,
    url: row.url,
    attempts: row.attempts,
    nextAt: row.next_at,
    deliveredAt: row.delivered_at,
    createdAt: row.created_at,
  };
}
