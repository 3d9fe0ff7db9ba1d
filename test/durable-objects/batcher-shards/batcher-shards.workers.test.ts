import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { batcherGroup, batcherName } from "../../../functions/delivery/batcher-plan.ts";
import { MODEL, chat, planOf, send } from "../../support/edge-batching.workers.ts";
import { chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { TEST_ADMIN_TOKEN } from "../../support/provided-context.ts";

const ORIGIN = inject("testOrigins").find((o) => o.id === "shards-1");
const REGION = "sh";

function configWith(batching: Record<string, unknown>): string {
  return JSON.stringify({
    models: [{ id: MODEL, max_model_len: 32768 }],
    regions: [{ id: REGION, origins: [{ id: "shards-1", url: ORIGIN?.url }] }],
    default_region: REGION,
    limits: { retry_budget: 0 },
    batching: { idle_bypass_ms: 0, ...batching },
  });
}

/** Sets the shard count that `config`'s directory holds, as if its Batchers had split. */
async function seedCount(config: string, count: number, epoch: number): Promise<void> {
  const directory = env.BATCHER_SHARDS.getByName(batcherGroup(REGION, MODEL, planOf(config)));
  await runInDurableObject(directory, (_, state) => {
    state.storage.sql.exec(
      `INSERT INTO shard_count (id, count, epoch, changed_at, splits)
       VALUES (1, ?, ?, ?, '[{"load":500,"lagMs":40}]')`,
      count,
      epoch,
      Date.now(),
    );
  });
}

function shard(config: string, index: number) {
  return env.BATCHER.getByName(batcherName(REGION, MODEL, index, planOf(config)));
}

async function drain(config: string, body: boolean) {
  const res = await send(
    config,
    body ? chat() : edgeRequest("/v1/chat/completions", { body: chatBody({ max_tokens: 2 }) }),
  ).response;
  expect(res.status).toBe(200);
  await res.text();
}

describe("Batcher shards", () => {
  it("reports each shard's load to its directory, and the count reaches the edge through the answers", async () => {
    const config = configWith({ max_shards: 4, max_window_ms: 1 });
    await seedCount(config, 2, 1);
    const directory = env.BATCHER_SHARDS.getByName(batcherGroup(REGION, MODEL, planOf(config)));
    // The edge knows one shard until a Batcher's answer says two.
    await drain(config, true);
    let view = await directory.view(planOf(config).scaling);
    for (let i = 0; i < 100 && view.reports.length === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      view = await directory.view(planOf(config).scaling);
    }
    expect(view.reports).toEqual([
      expect.objectContaining({ shard: 0, lagMs: expect.any(Number), inFlight: 0 }),
    ]);
    // Requests are spread by id over both shards now: within 40, one reaches shard 1.
    for (let i = 0; i < 40 && (await shard(config, 1).snapshot()).counters.submitted === 0; i++) {
      await drain(config, i % 2 === 0);
    }
    expect((await shard(config, 1).snapshot()).counters.submitted).toBeGreaterThan(0);
    const admin = await send(
      config,
      new Request(`http://edge.test/admin/batchers/${REGION}/${MODEL}`, {
        headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` },
      }),
    ).response;
    const body = await admin.json<{ scaling: { count: number }; shards: unknown[] }>();
    expect(body.scaling.count).toBe(2);
    expect(body.shards).toHaveLength(2);
  });

  it("keeps one shard and no directory where the count is fixed", async () => {
    const config = configWith({ max_shards: 1 });
    await drain(config, true);
    await drain(config, false);
    const directory = env.BATCHER_SHARDS.getByName(batcherGroup(REGION, MODEL, planOf(config)));
    expect((await directory.view(planOf(config).scaling)).reports).toEqual([]);
    expect((await shard(config, 0).snapshot()).counters.submitted).toBe(2);
  });
});
