import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { REFUSAL_HOLD_MS } from "../../../durable-objects/key-account/store/metrics.ts";
import type { KeyMetrics } from "../../../durable-objects/key-account/metrics.ts";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { newKey } from "../../support/key-accounts.workers.ts";

// One slot: a second request is refused for the key's concurrency.
const oneSlotAccount = () => newKey({ concurrency: 1 });

const requestsOf = (metrics: KeyMetrics, statusClass: string) =>
  metrics.series
    .filter((series) => series.statusClass === statusClass)
    .reduce((sum, series) => sum + series.requests, 0);

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("refusals in the key's metrics", () => {
  it("count a request asked again once, and not at all once it is admitted", async () => {
    const { stub, admit } = await oneSlotAccount();
    expect((await admit("a")).ok).toBe(true);
    // The edge asks again about a request refused a slot while others of its key run.
    for (let i = 0; i < 3; i++) {
      expect(await admit("b")).toMatchObject({ ok: false, limit: "concurrency" });
    }
    await stub.settle({
      requestId: "a",
      outcome: "ok",
      usage: { prompt_tokens: 1, completion_tokens: 1 },
    });
    expect((await admit("b")).ok).toBe(true);
    for (let i = 0; i < 5; i++) {
      expect(await admit("c")).toMatchObject({ ok: false, limit: "concurrency" });
    }
    // Held until the edge is done asking: not counted yet, then counted once.
    expect(requestsOf(await stub.metrics(), "4xx")).toBe(0);
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    const metrics = await stub.metrics();
    expect(requestsOf(metrics, "4xx")).toBe(1);
    expect(metrics.recentErrors.map((error) => error.requestId)).toEqual(["c"]);
    // A request whose refusal was counted is not counted again.
    expect(await admit("c")).toMatchObject({ ok: false, limit: "concurrency" });
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    expect(requestsOf(await stub.metrics(), "4xx")).toBe(1);
  });

  it("count a refusal nobody reads once its hold passed, and keep it across a restart", async () => {
    const { id, stub, admit } = await oneSlotAccount();
    expect((await admit("a")).ok).toBe(true);
    expect((await admit("b")).ok).toBe(false);
    await sleep(REFUSAL_HOLD_MS + 500);
    await evictDurableObject(stub);
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(requestsOf(await again.metrics(), "4xx")).toBe(1);
  });
});

describe("a request billed from its origin's record", () => {
  it("keeps how its edge delivered it, in its row and in the key's metrics", async () => {
    const { stub, admit } = await oneSlotAccount();
    expect((await admit("r")).ok).toBe(true);
    // Its client left and no END came: the edge releases it, telling how it was delivered.
    const served = { region: "us", origin: "us-1", result: "served" as const };
    const released = await stub.settle({
      requestId: "r",
      outcome: "cancelled",
      usage: null,
      usageUnknown: true,
      attempts: [served],
      metrics: { region: "us", status: 200, durationMs: 120, ttftMs: 30 },
    });
    expect(released).toMatchObject({ settled: false, reason: "reconciling" });
    // The account's reconciliation bills it from the origin's record, which tells no delivery.
    const usage = { prompt_tokens: 40, completion_tokens: 3 };
    const billed = await stub.settle({
      requestId: "r",
      outcome: "cancelled",
      usage,
      originBegan: true,
    });
    expect(billed).toMatchObject({ settled: true, usedTokens: 43 });
    const [row] = await stub.requests({ limit: 10, from: 0, to: Date.now() + 1 });
    expect(row).toMatchObject({
      requestId: "r",
      attempts: [served],
      httpStatus: 200,
      durationMs: 120,
      ttftMs: 30,
    });
    const metrics = await stub.metrics();
    expect(
      metrics.series.map(({ region, statusClass, requests }) => ({
        region,
        statusClass,
        requests,
      })),
    ).toEqual([{ region: "us", statusClass: "2xx", requests: 1 }]);
  });

  it("keeps it when its lease ran out before the edge released it", async () => {
    const { stub, admit } = await oneSlotAccount();
    expect((await admit("r", { leaseMs: 1_000 })).ok).toBe(true);
    await sleep(1_100);
    // Another admission expires the row whose lease ran out.
    expect((await admit("other")).ok).toBe(true);
    const served = { region: "us", origin: "us-1", result: "served" as const };
    await stub.settle({
      requestId: "r",
      outcome: "cancelled",
      usage: null,
      usageUnknown: true,
      attempts: [served],
      metrics: { region: "us", status: 200, durationMs: 1_050, ttftMs: 30 },
    });
    const usage = { prompt_tokens: 40, completion_tokens: 3 };
    await stub.settle({ requestId: "r", outcome: "cancelled", usage, originBegan: true });
    const rows = await stub.requests({ limit: 10, from: 0, to: Date.now() + 1 });
    expect(rows.find((row) => row.requestId === "r")).toMatchObject({
      attempts: [served],
      httpStatus: 200,
      ttftMs: 30,
    });
  });
});
