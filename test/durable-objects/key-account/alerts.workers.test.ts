import { describe, expect, inject, it } from "vitest";
import { verifyAlert } from "../../../contracts/alert-signature.ts";
import type { HookRecord } from "../../support/alert-receiver.ts";
import { budgetedKey, periods } from "../../support/key-accounts.workers.ts";
import { TEST_ALERT_SECRET } from "../../support/provided-context.ts";

const RECEIVER = inject("alertReceiver");
// 420 µ$ a request (see budgets.workers.test.ts).
const USAGE = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };

async function hook(name: string): Promise<HookRecord> {
  return (await fetch(`${RECEIVER}/hooks/${name}`)).json<HookRecord>();
}

/** Polls the receiver until `done` holds (the account's alarm delivers in the background). */
async function until(name: string, done: (record: HookRecord) => boolean): Promise<HookRecord> {
  for (let i = 0; i < 500; i++) {
    const record = await hook(name);
    if (done(record)) return record;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return hook(name);
}

async function spendRequests(
  account: Awaited<ReturnType<typeof budgetedKey>>,
  from: number,
  count: number,
): Promise<void> {
  for (let i = from; i < from + count; i++) {
    expect((await account.admitPriced(`r${i}`)).ok).toBe(true);
    await account.stub.settle({ requestId: `r${i}`, outcome: "ok", usage: USAGE });
  }
}

describe("soft budgets", () => {
  it("alerts once per window crossed, signed, retried until the webhook accepts it", async () => {
    const name = `soft-${crypto.randomUUID()}`;
    const account = await budgetedKey(periods(["1d", 100_000, 1_000]));
    await account.stub.update({
      alertWebhookUrl: `${RECEIVER}/hooks/${name}?fail=2`,
      now: Date.now(),
    });
    // 840 µ$: under the soft limit, no alert.
    await spendRequests(account, 0, 2);
    // 1,260 µ$: crossed; more spend in the same window raises nothing more.
    await spendRequests(account, 2, 3);
    const record = await until(name, (r) => r.deliveries.length > 0);
    expect(record.attempts).toBe(3);
    expect(record.deliveries).toHaveLength(1);
    const [delivery] = record.deliveries;
    const body = delivery?.body ?? "";
    expect(
      await verifyAlert(TEST_ALERT_SECRET, delivery?.signature ?? "", body, Date.now() / 1_000),
    ).toBe(true);
    expect(
      await verifyAlert("another secret", delivery?.signature ?? "", body, Date.now() / 1_000),
    ).toBe(false);
    expect(JSON.parse(body)).toMatchObject({
      type: "soft_budget_crossed",
      key_id: account.id,
      period: "1d",
      soft_usd: 0.001,
      max_usd: 0.1,
      spent_usd: 0.00126,
    });
    expect(delivery?.alertId).toMatch(/^key:1d:\d+$/);
    const { budgetAlerts } = await account.stub.metrics();
    expect(budgetAlerts).toEqual(
      expect.arrayContaining([
        { period: "1d", outcome: "raised", count: 1 },
        { period: "1d", outcome: "retried", count: 2 },
        { period: "1d", outcome: "delivered", count: 1 },
      ]),
    );
    // Later spend in the window sends nothing more.
    await spendRequests(account, 5, 1);
    expect((await hook(name)).attempts).toBe(3);
  });

  it("stops after the configured attempts and counts the alert dropped", async () => {
    const name = `dropped-${crypto.randomUUID()}`;
    const account = await budgetedKey(periods(["1h", 100_000, 400]));
    await account.stub.update({
      alertWebhookUrl: `${RECEIVER}/hooks/${name}?fail=100`,
      now: Date.now(),
    });
    await spendRequests(account, 0, 1);
    // The test configuration's `alerts.max_attempts`: four.
    const record = await until(name, (r) => r.attempts >= 4);
    expect(record.deliveries).toHaveLength(0);
    for (let i = 0; i < 100; i++) {
      const { budgetAlerts } = await account.stub.metrics();
      if (budgetAlerts.some((alert) => alert.outcome === "dropped")) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect((await account.stub.metrics()).budgetAlerts).toEqual(
      expect.arrayContaining([
        { period: "1h", outcome: "retried", count: 3 },
        { period: "1h", outcome: "dropped", count: 1 },
      ]),
    );
  });
});
