/**
 * The edge with one region whose origin is a test file's alone, for the tests of the
 * request path through the Batcher (docs/batching.md): configs, the region's Batcher and
 * its snapshot, the origin's call counts and faults, requests, and keys with their ledger.
 */
import {
  createExecutionContext,
  runInDurableObject,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { expect, inject } from "vitest";
import type { KeyAccount } from "../../durable-objects/key-account/index.ts";
import { loadConfig } from "../../contracts/config/gateway.ts";
import { type BatchingPlan, batchingPlan } from "../../contracts/config/plans.ts";
import { batcherName } from "../../functions/delivery/batcher-plan.ts";
import app from "../../functions/index.ts";
import { chatBody, edgeRequest, metricValue } from "./edge-requests.ts";
import { TEST_ADMIN_TOKEN } from "./provided-context.ts";

export const MODEL = "warmgate-sim-8b";

/**
 * Region `regionId` with origin `originId` alone (about 20 ms per token), which no other test
 * file uses, so its call counts are the caller's.
 */
/** The Batcher plan of `config`'s one region for {@link MODEL}. */
export function planOf(config: string): BatchingPlan {
  const parsed = loadConfig(config);
  const region = parsed.regions[0];
  if (region === undefined) throw new Error("no region");
  const plan = batchingPlan(parsed, region, MODEL);
  if (plan === null) throw new Error("no plan");
  return plan;
}

/** A request through the edge under `config`, with its execution context. */
export function send(config: string, request: Request) {
  const ctx = createExecutionContext();
  const response = Promise.resolve(app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx));
  return { response, done: () => waitOnExecutionContext(ctx) };
}

/** A streamed chat request, `max_tokens` 4 unless overridden. */
export function chat(
  overrides: Record<string, unknown> = {},
  headers: Record<string, string> = {},
) {
  return edgeRequest("/v1/chat/completions", {
    body: chatBody({ stream: true, max_tokens: 4, ...overrides }),
    headers,
  });
}

/** A new key, its auth header, and its ledger rows once none is open. */
export async function freshKey(name: string) {
  const created = await exports.default.fetch("http://edge.test/admin/keys", {
    method: "POST",
    headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}`, "content-type": "application/json" },
    body: JSON.stringify({ name }),
  });
  const { id, key } = await created.json<{ id: string; key: string }>();
  type Row = { state: string; outcome: string | null; completion_tokens: number | null };
  const settledRows = async (count: number): Promise<Row[]> => {
    const account = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    let rows: Row[] = [];
    for (let i = 0; i < 300; i++) {
      rows = await runInDurableObject(account, (instance: KeyAccount, state) => {
        instance.flush();
        return state.storage.sql
          .exec<Row>("SELECT state, outcome, completion_tokens FROM ledger")
          .toArray();
      });
      if (rows.length === count && rows.every((row) => row.state !== "open")) break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    return rows;
  };
  return { auth: { authorization: `Bearer ${key}` }, settledRows };
}

/** A long streaming request that keeps the origin busy; resolves once its first bytes came. */
export async function occupy(config: string, headers: Record<string, string> = {}) {
  const { response, done } = send(config, chat({ max_tokens: 2000 }, headers));
  const res = await response;
  expect(res.status).toBe(200);
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  await reader.read();
  return {
    reader,
    async release() {
      await reader.cancel();
      await done();
    },
  };
}

export function edgeBatching(originId: string, regionId: string) {
  const origin = inject("testOrigins").find((o) => o.id === originId);
  if (origin === undefined) throw new Error(`${originId} is not running`);
  const ORIGIN_URL = origin.url;
  const REGION = regionId;
  /**
   * While the origin is busy, a request waits up to a second unless a batch fills first;
   * every request asks the batcher (no idle bypass), so the occupier runs through it too.
   */
  const HOLD = { max_window_ms: 1000, call_interval_ms: 1000, idle_bypass_ms: 0 };

  /** A config with the one region and the given batching section. */
  function configWith(batching: Record<string, unknown>): string {
    return JSON.stringify({
      models: [{ id: MODEL, max_model_len: 32768 }],
      regions: [{ id: REGION, origins: [{ id: originId, url: ORIGIN_URL }] }],
      default_region: REGION,
      limits: { first_byte_timeout_ms: 5_000, retry_budget: 0 },
      batching,
    });
  }

  function batcherOf(config: string) {
    return env.BATCHER.getByName(batcherName(REGION, MODEL, 0, planOf(config)));
  }

  /** Polls the batcher until `done` holds. */
  async function waitForBatcher(
    config: string,
    done: (s: Awaited<ReturnType<ReturnType<typeof batcherOf>["snapshot"]>>) => boolean,
  ) {
    let snapshot = await batcherOf(config).snapshot();
    for (let i = 0; i < 200 && !done(snapshot); i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      snapshot = await batcherOf(config).snapshot();
    }
    return snapshot;
  }

  async function originCounts(): Promise<{ batches: number; items: number }> {
    const text = await (await fetch(`${ORIGIN_URL}/metrics`)).text();
    return {
      batches: metricValue(text, "warmgate_origin_batches_total"),
      items: metricValue(text, "warmgate_origin_batch_items_total"),
    };
  }

  /** Sets the origin's injected faults; null clears them. */
  async function setFaults(faults: Record<string, unknown> | null): Promise<void> {
    const res = await fetch(`${ORIGIN_URL}/admin/faults`, {
      method: faults === null ? "DELETE" : "PUT",
      headers: { "content-type": "application/json" },
      ...(faults !== null && { body: JSON.stringify(faults) }),
    });
    expect(res.ok).toBe(true);
    await res.arrayBuffer();
  }

  return {
    ORIGIN_URL,
    REGION,
    HOLD,
    configWith,
    batcherOf,
    waitForBatcher,
    originCounts,
    setFaults,
  };
}
