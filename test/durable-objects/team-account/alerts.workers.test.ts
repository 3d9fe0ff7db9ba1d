import { env, exports } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { verifyAlert } from "../../../contracts/alert-signature.ts";
import type { HookRecord } from "../../support/alert-receiver.ts";
import { ADMIN, createTeam } from "../../support/admin-keys.workers.ts";
import { teamAccount } from "../../../functions/accounts/teams.ts";
import { TEST_ALERT_SECRET } from "../../support/provided-context.ts";
import { teamKey } from "../../support/team-accounts.workers.ts";

const RECEIVER = inject("alertReceiver");

async function hook(name: string): Promise<HookRecord> {
  return (await fetch(`${RECEIVER}/hooks/${name}`)).json<HookRecord>();
}

/** Polls the receiver until `done` holds (the team's alarm delivers in the background). */
async function until(name: string, done: (record: HookRecord) => boolean): Promise<HookRecord> {
  for (let i = 0; i < 500; i++) {
    const record = await hook(name);
    if (done(record)) return record;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return hook(name);
}

/** A member key spends two requests (about 111 µ$), then leaves: its spend reaches the team. */
async function spend(teamId: string, prefix: string): Promise<void> {
  const key = await teamKey(teamId);
  for (const i of [0, 1]) {
    expect((await key.admit(`${prefix}_${i}`)).ok).toBe(true);
    await key.stub.settle({
      requestId: `${prefix}_${i}`,
      outcome: "ok",
      usage: { prompt_tokens: 10, completion_tokens: 90 },
    });
  }
  await key.stub.update({ teamId: null, now: Date.now() });
}

describe("team soft budgets", () => {
  it("alert once per window when member keys' spend crosses it, signed, retried and counted", async () => {
    const name = `team-soft-${crypto.randomUUID()}`;
    // Made through the admin API, so that the scrape finds it.
    const { id } = await createTeam({
      name: "team",
      budgets: [{ period: "1h", max_usd: 1, soft_usd: 0.0001 }],
      alert_webhook_url: `${RECEIVER}/hooks/${name}?fail=1`,
    });
    const team = { id, stub: teamAccount(env, id) };
    await spend(team.id, "req_soft_a");
    const record = await until(name, (r) => r.deliveries.length > 0);
    expect(record.attempts).toBe(2);
    const [delivery] = record.deliveries;
    const body = delivery?.body ?? "";
    expect(
      await verifyAlert(TEST_ALERT_SECRET, delivery?.signature ?? "", body, Date.now() / 1_000),
    ).toBe(true);
    expect(JSON.parse(body)).toMatchObject({
      type: "soft_budget_crossed",
      team_id: team.id,
      team_name: "team",
      period: "1h",
      soft_usd: 0.0001,
      max_usd: 1,
    });
    expect(delivery?.alertId).toMatch(/^team:1h:\d+$/);
    expect((await team.stub.metrics()).budgetAlerts).toEqual(
      expect.arrayContaining([
        { period: "1h", outcome: "raised", count: 1 },
        { period: "1h", outcome: "retried", count: 1 },
        { period: "1h", outcome: "delivered", count: 1 },
      ]),
    );
    const scrape = await exports.default.fetch("http://edge.test/metrics", { headers: ADMIN });
    expect(await scrape.text()).toContain(
      `warmgate_budget_alerts_total{team="${team.id}",period="1h",outcome="delivered"} 1`,
    );
    // More spend in the same window raises nothing more.
    await spend(team.id, "req_soft_b");
    expect((await team.stub.metrics()).budgetAlerts).toContainEqual({
      period: "1h",
      outcome: "raised",
      count: 1,
    });
    expect((await hook(name)).attempts).toBe(2);
  });
});
