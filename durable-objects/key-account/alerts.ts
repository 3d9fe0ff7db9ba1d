/**
 * Soft-budget alerts of any owner of budgets, a key or a team (docs/key-account.md, "Soft
 * budgets and alerts"): after settling, each window whose settled spend reached its soft
 * limit raises one alert (one per window, ever), and the owner's alarm delivers it to its
 * webhook (else the configuration's), signed, retried with exponential backoff until a 2xx
 * or its last attempt.
 */
import { HOUR_MS } from "../../contracts/budget-periods.ts";
import { ALERT_SIGNATURE_HEADER, signAlert } from "../../contracts/alert-signature.ts";
import { type AlertSettings, AlertsSchema } from "../../contracts/config/alerts.ts";
import { ConfigError, loadConfig } from "../../contracts/config/gateway.ts";
import { logWarn } from "../../contracts/log.ts";
import { picosToUsd } from "../../contracts/pricing.ts";
import { type BudgetLine, resetsAt, softCrossings } from "./budgets.ts";
import type { Budgets } from "./budget-types.ts";
import type { AlertOutcome } from "./metrics.ts";
import type { AlertStore } from "./store/alerts.ts";
import { KEY_SCOPE } from "./schema.ts";
import type { AccountStore } from "./store.ts";

// The longest wait between two attempts, and the longest an attempt may take.
const MAX_BACKOFF_MS = HOUR_MS;
const ATTEMPT_TIMEOUT_MS = 10_000;

/** Where an owner of budgets (a key, a team) keeps its alerts and counts their outcomes. */
export interface AlertBook {
  alerts: AlertStore;
  countAlert(period: string, outcome: AlertOutcome): void;
  /** Commits what was written. */
  flush(): void;
}

/** Whose budgets crossed: its scope (`key`, `team`), the body's fields naming it, its webhook. */
export interface AlertOwner {
  scope: string;
  names: Record<string, string>;
  url: string | null;
}

/**
 * Raises an alert for each soft limit of `lines` that its window's settled spend reached,
 * once per window (`<scope>:<period>:<first hour>`); true when one was raised (the owner's
 * alarm should deliver it).
 */
export function raiseCrossings(
  book: AlertBook,
  owner: AlertOwner,
  lines: readonly BudgetLine[],
  now: number,
): boolean {
  let raised = false;
  for (const crossing of softCrossings(lines)) {
    const alertId = `${owner.scope}:${crossing.period}:${crossing.window.startHour}`;
    if (book.alerts.has(alertId)) continue;
    const body = JSON.stringify({
      object: "budget.alert",
      type: "soft_budget_crossed",
      id: alertId,
      ...owner.names,
      period: crossing.period,
      window_start: (crossing.window.startHour * HOUR_MS) / 1_000,
      resets_at: (resetsAt(crossing) ?? 0) / 1_000,
      soft_usd: picosToUsd(crossing.softPicos),
      max_usd: picosToUsd(crossing.limitPicos),
      spent_usd: picosToUsd(crossing.spentPicos),
      created_at: Math.floor(now / 1_000),
    });
    book.alerts.put({
      alertId,
      scope: owner.scope,
      period: crossing.period,
      windowStart: crossing.window.startHour,
      body,
      url: owner.url,
      attempts: 0,
      nextAt: owner.url === null ? null : now,
      deliveredAt: null,
      createdAt: now,
    });
    book.countAlert(crossing.period, "raised");
    raised = true;
  }
  return raised;
}

/** The soft budgets of a list (the others never alert). */
export function softBudgets(budgets: Budgets): Budgets {
  return {
    periods: budgets.periods.filter((budget) => budget.softMicros !== null),
    creditMicros: null,
  };
}

/**
 * A key's alerts: for each hour the settlements since the last call landed in, the soft
 * limits they took their window to; true when one was raised (the alarm should run).
 */
export function raiseAlerts(
  store: AccountStore,
  now: number,
  settings: () => AlertSettings,
): boolean {
  const hours = store.spend.takeSettledHours();
  const record = store.key.record;
  const soft = record === null ? null : softBudgets(record.budgets);
  if (record === null || soft === null || soft.periods.length === 0 || hours.length === 0) {
    return false;
  }
  const owner: AlertOwner = {
    scope: KEY_SCOPE,
    names: { key_id: record.id, key_name: record.name },
    url: record.alertWebhookUrl ?? settings().webhookUrl,
  };
  let raised = false;
  for (const hour of hours) {
    const lines = store.spend.lines(soft, hour * HOUR_MS, KEY_SCOPE);
    if (raiseCrossings(keyBook(store), owner, lines, now)) raised = true;
  }
  return raised;
}

/** A key account's alert book. */
export function keyBook(store: AccountStore): AlertBook {
  return {
    alerts: store.alerts,
    countAlert: (period, outcome) => store.metrics.countAlert(period, outcome),
    flush: () => store.flush(),
  };
}

/** The `alerts` settings of a configuration, the defaults when it does not parse. */
export function alertSettings(config: string | undefined): AlertSettings {
  try {
    return loadConfig(config).alerts;
  } catch (error) {
    if (error instanceof ConfigError) return AlertsSchema.parse({});
    throw error;
  }
}

/**
 * Sends every alert whose attempt is due, signed with `secret` (no secret: dropped, as a
 * receiver could not trust it); each outcome is stored and counted.
 */
export async function deliverAlerts(
  book: AlertBook,
  now: number,
  settings: AlertSettings,
  secret: string | undefined,
): Promise<void> {
  for (const alert of book.alerts.due(now)) {
    if (alert.url === null || secret === undefined || secret === "") {
      if (secret === undefined || secret === "")
        logWarn("budget alert dropped: ALERT_SIGNING_SECRET is not set", { alert: alert.alertId });
      book.alerts.put({ ...alert, nextAt: null });
      book.countAlert(alert.period, "dropped");
      continue;
    }
    const ok = await attempt(alert.url, alert.alertId, alert.body, secret);
    const attempts = alert.attempts + 1;
    const at = Date.now();
    if (ok) {
      book.alerts.put({ ...alert, attempts, nextAt: null, deliveredAt: at });
      book.countAlert(alert.period, "delivered");
    } else if (attempts >= settings.maxAttempts) {
      book.alerts.put({ ...alert, attempts, nextAt: null });
      book.countAlert(alert.period, "dropped");
    } else {
      const wait = Math.min(MAX_BACKOFF_MS, settings.retryBaseMs * 2 ** (attempts - 1));
      book.alerts.put({ ...alert, attempts, nextAt: at + wait });
      book.countAlert(alert.period, "retried");
    }
  }
  book.flush();
}

// One delivery: a POST of the body, signed now; true for a 2xx.
async function attempt(
  url: string,
  alertId: string,
  body: string,
  secret: string,
): Promise<boolean> {
  try {
    const response = await fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-warmgate-alert-id": alertId,
        [ALERT_SIGNATURE_HEADER]: await signAlert(secret, Math.floor(Date.now() / 1_000), body),
      },
      body,
      signal: AbortSignal.timeout(ATTEMPT_TIMEOUT_MS),
    });
    await response.body?.cancel();
    return response.status >= 200 && response.status < 300;
  } catch {
    return false;
  }
}
