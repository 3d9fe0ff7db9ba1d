import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { usdPicos } from "../../support/edge-requests.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { METER, pricedConfig, send, chat, get } from "../../support/metering.workers.ts";

afterEach(async () => {
  await fetch(`${METER}/admin/faults`, { method: "DELETE" }).then((r) => r.arrayBuffer());
});

/** Longest one request of the mix may take (each takes well under a second). */
const REQUEST_DEADLINE_MS = 20_000;

async function withDeadline<T>(promise: Promise<T>, ms: number, what: () => string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not done in ${ms} ms: ${what()}`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

describe("conservation", () => {
  it("settles hundreds of mixed requests exactly once, costs summing to the key's totals", async () => {
    const { id, key } = await createKey({ name: "conservation" });
    // Some items fail before their first byte, some streams are cut mid-way.
    await fetch(`${METER}/admin/faults`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        errorRate: 0.15,
        errorStatuses: [500],
        dropAfterTokens: 3,
        dropRate: 0.2,
      }),
    }).then((r) => r.arrayBuffer());
    const ids: string[] = [];
    const kinds = ["json", "stream", "cancel", "json-alias", "stream-usage"] as const;
    for (let round = 0; round < 8; round++) {
      const batch = Array.from({ length: 25 }, async (_, i) => {
        const kind = kinds[(round * 25 + i) % kinds.length] ?? "json";
        const config = pricedConfig({ batching: i % 2 === 0 });
        const body =
          kind === "json-alias"
            ? { model: "fast", max_tokens: 10 + i }
            : kind === "stream-usage"
              ? { stream: true, stream_options: { include_usage: true }, max_tokens: 10 + i }
              : { stream: kind !== "json", max_tokens: kind === "cancel" ? 400 : 10 + i };
        const region = kind === "cancel" ? "metering-slow" : "metering";
        let phase = "before its headers";
        const sent = send(config, chat(key, body, region), async (r) => {
          phase = `${r.status}, reading its body`;
          if (kind !== "cancel" || r.body === null) {
            await r.arrayBuffer().catch(() => null);
          } else {
            const reader = r.body.getReader();
            await reader.read();
            await reader.cancel();
          }
          phase = `${r.status} ${r.headers.get("x-request-id")}, its body read; settling`;
          return null;
        });
        // A request that never ends fails the test with what it was, not the test's timeout.
        const what = () =>
          `round ${round}, ${kind}, ${JSON.stringify(body)}, batching ${i % 2 === 0}: ${phase}`;
        const { response } = await withDeadline(sent, REQUEST_DEADLINE_MS, what);
        ids.push(response.headers.get("x-request-id") ?? "");
      });
      await Promise.all(batch);
    }
    expect(ids).toHaveLength(200);
    const state = await runInDurableObject(
      env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id)),
      (instance: KeyAccount, s) => {
        instance.flush();
        const sql = s.storage.sql;
        return {
          rows: sql
            // Pico-dollars, as SQLite computes them (exact for these small amounts).
            .exec<{ request_id: string; state: string; cost: number }>(
              "SELECT request_id, state, cost_micros * 1000000 + cost_picos AS cost FROM ledger",
            )
            .toArray(),
          rollup: sql
            .exec<{ requests: number; cost: number }>(
              `SELECT SUM(requests) AS requests, SUM(cost_micros * 1000000 + cost_picos) AS cost
               FROM usage_daily`,
            )
            .one(),
          spend: sql
            .exec<{ settled: number; reserved: number }>(
              `SELECT settled_micros * 1000000 + settled_picos AS settled,
                 reserved_micros * 1000000 + reserved_picos AS reserved
               FROM spend WHERE period = 'all'`,
            )
            .one(),
        };
      },
    );
    // Every admitted request has exactly one ledger row, and every row is closed.
    expect(new Set(ids).size).toBe(200);
    expect(state.rows.map((row) => row.request_id).sort()).toEqual([...ids].sort());
    expect(state.rows.filter((row) => row.state !== "settled")).toEqual([]);
    // Conservation: the rows' costs are the rollups' and the key's spend, nothing reserved.
    const sum = state.rows.reduce((total, row) => total + row.cost, 0);
    expect(sum).toBeGreaterThan(0);
    expect(state.rollup).toEqual({ requests: 200, cost: sum });
    expect(state.spend).toEqual({ settled: sum, reserved: 0 });
    // And the usage API says the same.
    const { body } = await send(pricedConfig(), get(key, "/v1/usage"), (r) => r.json());
    const report = body as { total: { requests: number; cost_usd: number } };
    expect(report.total.requests).toBe(200);
    expect(usdPicos(report.total.cost_usd)).toBe(BigInt(sum));
  }, 60_000);

  it("never lets concurrent requests together overdraw a small budget", async () => {
    const { id, key } = await createKey({
      name: "budget-race",
      budgets: [{ period: "1d", max_usd: 0.0005 }],
    });
    const results = await Promise.all(
      Array.from({ length: 60 }, () => send(pricedConfig(), chat(key, { max_tokens: 100 }))),
    );
    const statuses = results.map(({ response }) => response.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(0);
    expect(statuses.filter((s) => s === 429).length).toBeGreaterThan(0);
    expect(statuses.every((s) => s === 200 || s === 429)).toBe(true);
    const spend = await runInDurableObject(
      env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id)),
      (instance: KeyAccount, s) => {
        instance.flush();
        return s.storage.sql
          .exec<{ settled: number; reserved: number }>(
            `SELECT settled_micros * 1000000 + settled_picos AS settled,
               reserved_micros * 1000000 + reserved_picos AS reserved
             FROM spend WHERE period = 'all'`,
          )
          .one();
      },
    );
    expect(spend.reserved).toBe(0);
    expect(spend.settled).toBeGreaterThan(0);
    expect(spend.settled).toBeLessThanOrEqual(500_000_000); // $0.0005 in pico-dollars
  });
});
