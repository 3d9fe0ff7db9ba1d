import { env } from "cloudflare:workers";
import * as fc from "fast-check";
import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { describe, expect, inject, it } from "vitest";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { batchingPlan } from "../../../contracts/config/plans.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { batchCreateBody, EDGE, chatBody } from "../../support/edge-requests.ts";
import { sendWith } from "../../support/test-origins.workers.ts";
import { BatchStore } from "../../../durable-objects/batch-run/store.ts";
import type { BatchState } from "../../../durable-objects/batch-run/lifecycle.ts";
import type { BatchCreateInput, BatchRunPlan } from "../../../durable-objects/batch-run/types.ts";

const CONFIG = inject("warmgateConfig");

type Batch = {
  id: string;
  status: string;
  output_file_id: string | null;
  error_file_id: string | null;
  request_counts: { total: number; completed: number; failed: number };
};

function call(key: string, path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.set("authorization", `Bearer ${key}`);
  return sendWith(CONFIG, new Request(`${EDGE}${path}`, { ...init, headers }));
}

async function batchOf(key: string, lines: number, maxTokens: number, region: string) {
  const text = Array.from({ length: lines }, (_, i) =>
    JSON.stringify({
      custom_id: `r${String(i).padStart(4, "0")}`,
      method: "POST",
      url: "/v1/chat/completions",
      body: chatBody({ max_tokens: maxTokens }),
    }),
  ).join("\n");
  const form = new FormData();
  form.set("purpose", "batch");
  form.set("file", new File([text], "in.jsonl"));
  const file = await (
    await call(key, "/v1/files", { method: "POST", body: form })
  ).json<{
    id: string;
  }>();
  const res = await call(key, "/v1/batches", {
    method: "POST",
    headers: { "content-type": "application/json", "x-warmgate-region": region },
    body: batchCreateBody(file.id),
  });
  expect(res.status).toBe(200);
  return { file: file.id, batch: await res.json<Batch>() };
}

async function settled(key: string, id: string): Promise<Batch> {
  for (;;) {
    const batch = await (await call(key, `/v1/batches/${id}`)).json<Batch>();
    if (["completed", "failed", "expired", "cancelled"].includes(batch.status)) return batch;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A store holding a batch `id` of one line per prefix, every line pending. */
function storeOf(
  state: DurableObjectState,
  id: string,
  prefixes: readonly (number | null)[],
): BatchStore {
  const store = new BatchStore(state.storage);
  const lines = prefixes.map((prefix, i) => ({
    customId: `c${i}`,
    prefix,
    offset: 0,
    bytes: 1,
    promptTokens: 1,
    maxTokens: 1,
    reservePicos: 1n,
  }));
  const run = { batchers: ["unused"] } as unknown as BatchRunPlan;
  store.create({ id, owner: "k", lines, run } as BatchCreateInput, { id } as BatchState);
  return store;
}

describe("a BatchRun", () => {
  it("starts the lines that share a prefix together, whatever their order in the file", async () => {
    const stub = env.BATCH_RUN.getByName("batch_00000000000prefixes1");
    const started = await runInDurableObject(stub, (_instance, state) => {
      const store = storeOf(state, "batch_00000000000prefixes1", [7, 9, 7, null, 9, 7]);
      return [store.startLines(4, 0), store.startLines(4, 0)].map((sent) =>
        sent.map((line) => line.idx),
      );
    });
    // Lines 0, 2 and 5 share one prefix, 1 and 4 another; 3 has none.
    expect(started).toEqual([
      [3, 0, 2, 5],
      [1, 4],
    ]);
  });

  it("keeps each state's count as its lines move, as the table holds them", async () => {
    // Every move, also those that must change nothing (a line ended twice, released when
    // not running, requeued while this incarnation runs it).
    const move = fc.record({
      kind: fc.constantFrom("start", "release", "finish", "requeue"),
      idx: fc.nat(39),
      limit: fc.nat(4),
      ok: fc.boolean(),
    });
    let run = 0;
    let mostEnded = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(move, { maxLength: 300, size: "max" }), async (moves) => {
        const id = `batch_000000000counts${String(run++).padStart(4, "0")}`;
        const seen = await runInDurableObject(env.BATCH_RUN.getByName(id), (_instance, state) => {
          const prefixes = Array.from({ length: 40 }, (_, i) => i % 3);
          const store = storeOf(state, id, prefixes);
          const found: string[] = [];
          for (const [step, { kind, idx, limit, ok }] of moves.entries()) {
            if (kind === "start") store.startLines(limit, step);
            else if (kind === "release") store.release(idx);
            else if (kind === "finish") {
              store.finish(
                idx,
                { ok, record: "{}", httpStatus: 200, origin: "o-1", now: step },
                null,
              );
            } else store.requeueRunning(new Set([idx]));
            // A store opened on the same rows counts them afresh.
            const kept = JSON.stringify(store.counts());
            const table = JSON.stringify(new BatchStore(state.storage).counts());
            if (kept !== table) found.push(`step ${step}: ${kept} != ${table}`);
          }
          const counts = store.counts();
          return { found, total: counts.total, ended: counts.ok + counts.failed };
        });
        mostEnded = Math.max(mostEnded, seen.ended);
        expect(seen.found).toEqual([]);
        expect(seen.total).toBe(40);
      }),
      { numRuns: 25, seed: 11 },
    );
    // The moves reached ended lines, not only pending and running ones.
    expect(mostEnded).toBeGreaterThan(10);
  });

  it("survives a restart mid-way: lines that were running go again, each answered and billed once", async () => {
    const { key } = await createKey({ name: "restart-batch" });
    // About 20 ms a token: lines still run when the object restarts.
    const { batch } = await batchOf(key, 80, 3, "slow");
    const stub = env.BATCH_RUN.getByName(batch.id);
    // What a restart leaves: lines marked running (durably, before they were sent) whose
    // calls died with the instance that sent them.
    const stranded = await runInDurableObject(stub, (_instance, state) => {
      state.storage.sql.exec("UPDATE lines SET state = 'running' WHERE state = 'pending'");
      return state.storage.sql
        .exec<{ n: number }>("SELECT COUNT(*) AS n FROM lines WHERE state = 'running'")
        .one().n;
    });
    expect(stranded).toBeGreaterThan(0);
    await evictDurableObject(stub);

    const done = await settled(key, batch.id);
    expect(done.status).toBe("completed");
    expect(done.request_counts).toEqual({ total: 80, completed: 80, failed: 0 });
    const output = await (await call(key, `/v1/files/${done.output_file_id}/content`)).text();
    const ids = output
      .trim()
      .split("\n")
      .map((l) => (JSON.parse(l) as { custom_id: string }).custom_id);
    expect(ids).toEqual(Array.from({ length: 80 }, (_, i) => `r${String(i).padStart(4, "0")}`));
    // Billed once per line, whatever ran twice.
    const usage = await (await call(key, "/v1/usage")).json<{ total: { requests: number } }>();
    expect(usage.total.requests).toBe(80);
  });

  it("fails the lines it had not read when its input file is deleted, and ends", async () => {
    const { key } = await createKey({ name: "deleted-input" });
    const { file, batch } = await batchOf(key, 200, 3, "slow");
    expect((await call(key, `/v1/files/${file}`, { method: "DELETE" })).status).toBe(200);
    const done = await settled(key, batch.id);
    expect(done.status).toBe("completed");
    const { total, completed, failed } = done.request_counts;
    expect(total).toBe(200);
    expect(completed + failed).toBe(200);
    expect(failed).toBeGreaterThan(0);
    const errors = await (await call(key, `/v1/files/${done.error_file_id}/content`)).text();
    const codes = new Set(
      errors
        .trim()
        .split("\n")
        .map((l) => (JSON.parse(l) as { error: { code: string } }).error.code),
    );
    expect([...codes]).toEqual(["input_file_deleted"]);
  });

  it("expires at the end of its 24-hour window: lines not run go to the error file", async () => {
    const { key, id: keyId } = await createKey({ name: "expiring-batch" });
    const { file } = await batchOf(key, 1, 1, "eu");
    const config = loadConfig(CONFIG);
    const plan = batchingPlan(config, { id: "eu" }, "warmgate-sim-8b");
    if (plan === null) throw new Error("no plan");
    const id = "batch_00000000000expired01";
    const stub = env.BATCH_RUN.getByName(id);
    const created = await stub.create({
      id,
      owner: keyId,
      endpoint: "/v1/chat/completions",
      inputFileId: file,
      metadata: null,
      // Created a day and a second ago: its window is over before any line runs.
      now: Date.now() - 86_401_000,
      run: {
        setup: plan.setup,
        batchers: ["unused"],
        lane: plan.setup.window.batchLane ?? 0,
        linesInFlight: 4,
        firstByteTimeoutMs: 1000,
        itemTimeoutMs: 1000,
        model: "warmgate-sim-8b",
        price: config.models[0]?.price ?? {
          inputMicrosPerMtok: 0,
          cachedInputMicrosPerMtok: 0,
          outputMicrosPerMtok: 0,
        },
        priceSharePpm: 500_000,
      },
      lines: ["x", "y"].map((customId) => ({
        customId,
        prefix: null,
        offset: 0,
        bytes: 1,
        promptTokens: 1,
        maxTokens: 1,
        reservePicos: 1n,
      })),
    });
    expect(created.ok).toBe(true);
    const done = await settled(key, id);
    expect(done.status).toBe("expired");
    expect(done.request_counts).toEqual({ total: 2, completed: 0, failed: 2 });
    expect(done.output_file_id).toBeNull();
    const errors = await (await call(key, `/v1/files/${done.error_file_id}/content`)).text();
    const records = errors
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { custom_id: string; error: { code: string } });
    expect(records.map((r) => [r.custom_id, r.error.code])).toEqual([
      ["x", "batch_expired"],
      ["y", "batch_expired"],
    ]);
  });
});
