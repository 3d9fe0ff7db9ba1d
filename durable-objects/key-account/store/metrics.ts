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

/**
 * How long a refusal waits before it is counted, from the request's last refusal: the edge
 * asks again about a request its key refused while others of the key run in its isolate
 * (docs/key-account.md, "Concurrency": 250 ms, after up to a second trimming its leases; a
 * few seconds when the account's queue is long), and a request is counted once, refused or
 * admitted, however many times it was asked.
 */
export const REFUSAL_HOLD_MS = 5_000;

/** How long a counted refusal's request id is kept, so that it is not counted again. */
const COUNTED_MEMORY_MS = 60_000;

/** Most refusals held, and request ids kept, at once: a flood of them is counted sooner. */
const MAX_HELD = 10_000;

/** The key's metrics, memory ahead of SQLite. */
export class MetricsStore {
  readonly #sql: SqlStorage;
  readonly #writes: WriteBehind;
  #state: MetricsState | null = null;
  // Refusals not counted yet, by request id: the latest of each request's.
  readonly #refused = new Map<string, RequestSample>();
  // Requests whose refusal was counted, and when.
  readonly #counted = new Map<string, number>();
  #timer: ReturnType<typeof setTimeout> | null = null;

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

  /**
   * Counts a refused request once its hold passed ({@link REFUSAL_HOLD_MS}) and it was not
   * admitted meanwhile; a request refused again replaces its refusal, and one whose refusal
   * was counted is not counted again.
   */
  refuse(sample: RequestSample): void {
    if (this.#counted.has(sample.requestId)) return;
    this.#refused.delete(sample.requestId);
    this.#refused.set(sample.requestId, sample);
    if (this.#refused.size > MAX_HELD) this.countRefusals();
    this.#timer ??= setTimeout(() => this.countRefusals(), REFUSAL_HOLD_MS);
  }

  /** The request was admitted: a refusal of it before is not counted. */
  admitted(requestId: string): void {
    this.#refused.delete(requestId);
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

  /**
   * Counts the refusals held since `now - REFUSAL_HOLD_MS` or longer (every one, given
   * `Infinity`: for tests and direct reads), and the oldest beyond {@link MAX_HELD}; a timer
   * runs on while others wait.
   */
  countRefusals(now = Date.now()): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    const clock = Date.now();
    for (const [requestId, at] of this.#counted) {
      if (at > clock - COUNTED_MEMORY_MS && this.#counted.size <= MAX_HELD) break;
      this.#counted.delete(requestId);
    }
    for (const [requestId, sample] of this.#refused) {
      const crowded = this.#refused.size > MAX_HELD;
      if (!crowded && sample.at > now - REFUSAL_HOLD_MS) break;
      this.#refused.delete(requestId);
      this.#counted.set(requestId, clock);
      this.add(sample);
    }
    const next = this.#refused.values().next();
    if (next.done !== true) {
      const wait = Math.max(1, next.value.at + REFUSAL_HOLD_MS - Date.now());
      this.#timer = setTimeout(() => this.countRefusals(), wait);
    }
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
