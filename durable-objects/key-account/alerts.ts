/**
 * Soft-budget alerts (docs/key-account.md, "Soft budgets and alerts"): after settling, each
 * window whose settled spend reached its soft limit raises one alert (one per window, ever),
 * and the alarm delivers it to the key's webhook (else the configuration's), signed, retried
 * with exponential backoff until a 2xx or its last attempt.
 */
import { HOUR_MS } from "../../contracts/budget-periods.ts";
import { ALERT_SIGNATURE_HEADER, signAlert } from "../../contracts/alert-signature.ts";
import type { AlertSettings } from "../../contracts/config/alerts.ts";
import { logWarn } from "../../contracts/log.ts";
import { picosToUsd } from "../../contracts/pricing.ts";
import { resetsAt, softCrossings } from "./budgets.ts";
import { KEY_SCOPE } from "./schema.ts";
import type { AccountStore } from "./store.ts";

// The longest wait between two attempts, and the longest an attempt may take.
const MAX_BACKOFF_MS = HOUR_MS;
const ATTEMPT_TIMEOUT_MS = 10_000;

/**
 * Raises an alert for each soft limit the settlements since the last call took their window
 * to; true when one was raised (the alarm should run).
 */
export function raiseAlerts(
  store: AccountStore,
  now: number,
  settings: () => AlertSettings,
): boolean {
  const hours = store.spend.takeSettledHours();
  const record = store.key.record;
  const soft = record?.budgets.periods.filter((budget) => budget.softMicros !== null) ?? [];
  if (record === null || soft.length === 0 || hours.length === 0) return false;
  let raised = false;
  for (const hour of hours) {
    const lines = store.spend.lines(
      { periods: soft, creditMicros: null },
      hour * HOUR_MS,
      KEY_SCOPE,
    );
    for (const crossing of softCrossings(lines)) {
      const alertId = `${KEY_SCOPE}:${crossing.period}:${crossing.window.startHour}`;
      if (store.alerts.has(alertId)) continue;
      const url = record.alertWebhookUrl ?? settings().webhookUrl;
      const body = JSON.stringify({
        object: "budget.alert",
        type: "soft_budget_crossed",
        id: alertId,
        key_id: record.id,
        key_name: record.name,
        period: crossing.period,
        window_start: (crossing.window.startHour * HOUR_MS) / 1_000,
        resets_at: (resetsAt(crossing) ?? 0) / 1_000,
        soft_usd: picosToUsd(crossing.softPicos),
        max_usd: picosToUsd(crossing.limitPicos),
        spent_usd: picosToUsd(crossing.spentPicos),
        created_at: Math.floor(now / 1_000),
      });
      store.alerts.put({
        alertId,
        scope: KEY_SCOPE,
        period: crossing.period,
        windowStart: crossing.window.startHour,
        body,
        url,
        attempts: 0,
        nextAt: url === null ? null : now,
        deliveredAt: null,
        createdAt: now,
      });
      store.metrics.countAlert(crossing.period, "raised");
      raised = true;
    }
  }
  return raised;
}

/**
 * Sends every alert whose attempt is due, signed with `secret` (no secret: dropped, as a
 * receiver could not trust it); each outcome is stored and counted.
 */
export async function deliverAlerts(
  store: AccountStore,
  now: number,
  settings: AlertSettings,
  secret: string | undefined,
): Promise<void> {
  for (const alert of store.alerts.due(now)) {
    if (alert.url === null || secret === undefined || secret === "") {
      if (secret === undefined || secret === "")
        logWarn("budget alert dropped: ALERT_SIGNING_SECRET is not set", { alert: alert.alertId });
      store.alerts.put({ ...alert, nextAt: null });
      store.metrics.countAlert(alert.period, "dropped");
      continue;
    }
    const ok = await attempt(alert.url, alert.alertId, alert.body, secret);
    const attempts = alert.attempts + 1;
    const at = Date.now();
    if (ok) {
      store.alerts.put({ ...alert, attempts, nextAt: null, deliveredAt: at });
      store.metrics.countAlert(alert.period, "delivered");
    } else if (attempts >= settings.maxAttempts) {
      store.alerts.put({ ...alert, attempts, nextAt: null });
      store.metrics.countAlert(alert.period, "dropped");
    } else {
      const wait = Math.min(MAX_BACKOFF_MS, settings.retryBaseMs * 2 ** (attempts - 1));
      store.alerts.put({ ...alert, attempts, nextAt: at + wait });
      store.metrics.countAlert(alert.period, "retried");
    }
  }
  store.flush();
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
