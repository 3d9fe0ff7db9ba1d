/**
 * A team's soft-budget alerts (docs/key-account.md, "Soft budgets and alerts"): raised when
 * the spend its member keys report takes a window to its soft limit, delivered by the
 * team's alarm through the same signed, retried webhook as a key's (table `budget_alerts`),
 * and their outcomes counted per period (table `alert_counts`) for `/metrics`.
 */
import { WriteBehind } from "../write-behind.ts";
import { AlertStore } from "../key-account/store/alerts.ts";
import type { AlertBook } from "../key-account/alerts.ts";
import type { AlertOutcome } from "../key-account/metrics.ts";

/** One count of alert outcomes, as `/metrics` reads it. */
export interface AlertCount {
  period: string;
  outcome: AlertOutcome;
  count: number;
}

/** The team's alerts and their counts, memory ahead of SQLite, committed by `flush`. */
export class TeamAlerts implements AlertBook {
  readonly alerts: AlertStore;
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  readonly #counts = new Map<string, AlertCount>();

  constructor(storage: DurableObjectStorage) {
    this.#sql = storage.sql;
    // Committed by `flush` at the end of each call that changed them.
    this.#writes = new WriteBehind(storage, 0);
    this.alerts = new AlertStore(storage.sql, this.#writes);
  }

  /** Loads the alerts and counts kept (at start). */
  load(): void {
    this.alerts.load();
    for (const row of this.#sql.exec<{ period: string; outcome: AlertOutcome; count: number }>(
      "SELECT period, outcome, count FROM alert_counts",
    )) {
      this.#counts.set(`${row.period}\n${row.outcome}`, { ...row });
    }
  }

  countAlert(period: string, outcome: AlertOutcome): void {
    const slot = `${period}\n${outcome}`;
    const next = { period, outcome, count: (this.#counts.get(slot)?.count ?? 0) + 1 };
    this.#counts.set(slot, next);
    this.#writes.set(`count:${slot}`, () =>
      this.#sql.exec(
        "INSERT OR REPLACE INTO alert_counts (period, outcome, count) VALUES (?, ?, ?)",
        period,
        outcome,
        next.count,
      ),
    );
  }

  flush(): void {
    this.#writes.flush();
  }

  /** Every count so far. */
  counts(): AlertCount[] {
    return [...this.#counts.values()];
  }
}
