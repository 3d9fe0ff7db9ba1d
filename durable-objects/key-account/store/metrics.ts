/**
 * The key's request metrics (table `metrics`: one row per series, one for the recent
 * errors), loaded on first use and written behind with the settlement or refusal that
 * counted them: no call of their own (docs/metrics.md).
 */
import type { WriteBehind } from "../../write-behind.ts";
import {
  type AlertOutcome,
  type KeyMetrics,
  type MetricsState,
  type RecentError,
  type RequestSample,
  type RequestSeries,
  addSample,
} from "../metrics.ts";
import type { KeyRecord } from "../types.ts";

/** The key's metrics, memory ahead of SQLite. */
export class MetricsStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  #state: MetricsState | null = null;

  constructor(sql: SqlStorage, writes: WriteBehind) {
    this.#sql = sql;
    this.#writes = writes;
  }

  /** Counts one request; written behind with whatever else its call changed. */
  add(sample: RequestSample): void {
    const state = this.#load();
    const { key, isError } = addSample(state, sample);
    this.#put(key, state.series.get(key));
    if (isError) this.#put("errors", state.errors);
  }

  /** Counts one soft-budget alert event of a period (docs/metrics.md). */
  countAlert(period: string, outcome: AlertOutcome): void {
    const state = this.#load();
    const slot = `${period}\n${outcome}`;
    state.alerts[slot] = (state.alerts[slot] ?? 0) + 1;
    this.#put("budget_alerts", state.alerts);
  }

  /** The metrics of the key `record` describes, as they stand. */
  report(record: KeyRecord | null): KeyMetrics {
    const state = this.#load();
    return {
      keyId: record?.id ?? "",
      name: record?.name ?? "",
      tier: record?.tier ?? "standard",
      series: [...state.series.values()],
      recentErrors: [...state.errors],
      budgetAlerts: Object.entries(state.alerts).map(([slot, count]) => {
        const [period = "", outcome = "raised"] = slot.split("\n");
        return { period, outcome: outcome as AlertOutcome, count };
      }),
    };
  }

  #load(): MetricsState {
    if (this.#state !== null) return this.#state;
    const state: MetricsState = { series: new Map(), errors: [], alerts: {} };
    for (const row of this.#sql.exec<{ name: string; data: string }>(
      "SELECT name, data FROM metrics",
    )) {
      if (row.name === "errors") state.errors = JSON.parse(row.data) as RecentError[];
      else if (row.name === "budget_alerts") {
        state.alerts = JSON.parse(row.data) as Record<string, number>;
      } else state.series.set(row.name, JSON.parse(row.data) as RequestSeries);
    }
    this.#state = state;
    return state;
  }

  #put(name: string, value: unknown): void {
    this.#writes.set(`metrics:${name}`, () =>
      this.#sql.exec(
        "INSERT INTO metrics (name, data) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET data = excluded.data",
        name,
        JSON.stringify(value),
      ),
    );
  }
}
