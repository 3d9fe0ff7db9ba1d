import { env } from "cloudflare:workers";
import { abortAllDurableObjects, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { type Batcher } from "../../../durable-objects/batcher/index.ts";
import { OPEN_BATCH_RECORD_DELAY_MS } from "../../../durable-objects/batcher/records.ts";
import { DEFAULT_BREAKER_SETTINGS } from "../../../contracts/config/breakers.ts";
import type { BatcherSetup } from "../../../contracts/config/plans.ts";
import {
  DEFAULT_BATCHING,
  type WindowConfigInput,
  windowConfig,
} from "../../support/window-config.ts";
import { chatBody } from "../../support/edge-requests.ts";
import {
  urlOf,
  HOLD,
  batcher,
  openOn,
  openedFrames,
  readItem,
  untilHead,
  waitForCounts,
  quiet,
  direct,
  release,
  occupy,
  opened,
} from "../../support/batcher-harness.workers.ts";

async function lagThread(b: ReturnType<typeof batcher>, busyMs: number, stretches: number) {
  const frames = b.stream("lagger", {
    body: { max_tokens: 2000 },
    maxTokens: 2000,
    avoidOrigins: b.setup.origins.map((o) => o.id).filter((id) => id !== "batch-1"),
  });
  await untilHead(frames);
  await runInDurableObject(b.stub, async () => {
    for (let i = 0; i < stretches; i++) {
      const until = Date.now() + busyMs;
      // oxlint-disable-next-line no-empty
      while (Date.now() < until) {}
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  });
  const snapshot = await b.stub.snapshot();
  await release(b, "lagger", frames);
  return snapshot;
}

/** A streamed body's reads, as text. */
async function reads(body: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  const decoder = new TextDecoder();
  for await (const chunk of body) out.push(decoder.decode(chunk));
  return out;
}

/**
 * A 12-token streamed item from eu-1, which answers at once (its tokens come much faster
 * than any hold), opened once the thread lags, and read to its end.
 */
async function itemAfterLag(window: Partial<WindowConfigInput>, id: string) {
  const b = batcher(window, ["batch-1", "eu-1"]);
  const body = chatBody({ stream: true, max_tokens: 12, seed: 4 });
  const expected = new TextDecoder().decode(await direct(body, "eu-1"));
  const lagged = await lagThread(b, 40, 12);
  const item = await opened(b, id, { body, maxTokens: 12, avoidOrigins: ["batch-1"] });
  const chunks = await reads(item.body);
  const after = await b.stub.snapshot();
  return { expected, lagged, head: item.head, chunks, trailer: await item.trailer(), after };
}

describe("holding a streamed item's later tokens while the thread lags", () => {
  it("joins later tokens into fewer writes; the first step leaves at once, bytes unchanged", async () => {
    const { expected, lagged, head, chunks, trailer, after } = await itemAfterLag(
      { holdShare: 1, maxHoldMs: 100, holdMinInFlight: 0 },
      "held",
    );
    expect(lagged.threadLagMs).toBeGreaterThan(10);
    expect(lagged.holdMs).toBeGreaterThan(10);
    expect(head.origin).toBe("eu-1");
    expect(chunks.join("")).toEqual(expected);
    expect(trailer).toMatchObject({ id: "held", outcome: "ok" });
    // The first step leaves on its own; the rest waits for the hold and leaves with the END
    // (unheld, its 14 events leave in about six writes).
    expect(chunks.length).toBeGreaterThan(1);
    expect(chunks.length).toBeLessThanOrEqual(3);
    expect(after.counters.holds).toBeGreaterThan(0);
  });

  it("delivers each step on its own by default while few items run, however late the thread runs", async () => {
    const { expected, lagged, chunks, trailer, after } = await itemAfterLag({}, "few");
    expect(lagged.threadLagMs).toBeGreaterThan(10);
    expect(lagged.holdMs).toBe(0);
    expect(chunks.join("")).toEqual(expected);
    expect(trailer).toMatchObject({ id: "few", outcome: "ok" });
    // Unheld, its 14 events leave in about six writes; held, in at most three.
    expect(chunks.length).toBeGreaterThan(3);
    expect(after.counters.holds).toBe(0);
  });

  it("holds nothing with a hold share of 0, however late the thread runs", async () => {
    const { expected, lagged, chunks, trailer, after } = await itemAfterLag(
      { holdShare: 0, holdMinInFlight: 0 },
      "unheld",
    );
    expect(lagged.threadLagMs).toBeGreaterThan(10);
    expect(lagged.holdMs).toBe(0);
    expect(chunks.join("")).toEqual(expected);
    expect(trailer).toMatchObject({ id: "unheld", outcome: "ok" });
    expect(after.counters.holds).toBe(0);
  });
});

/** Counts every write to the batcher's `open_batches` table from now on, by kind. */
async function watchRecords(b: ReturnType<typeof batcher>) {
  // Creates the object (and its tables) before the triggers go in.
  await b.stub.snapshot();
  await runInDurableObject(b.stub, (_instance: Batcher, state) => {
    state.storage.sql.exec(`CREATE TABLE writes_seen (kind TEXT NOT NULL);
      CREATE TRIGGER seen_insert AFTER INSERT ON open_batches
        BEGIN INSERT INTO writes_seen VALUES ('insert'); END;
      CREATE TRIGGER seen_delete AFTER DELETE ON open_batches
        BEGIN INSERT INTO writes_seen VALUES ('delete'); END;`);
  });
  return () =>
    runInDurableObject(b.stub, (_instance: Batcher, state) => ({
      rows: state.storage.sql.exec<{ n: number }>("SELECT COUNT(*) AS n FROM open_batches").one().n,
      writes: state.storage.sql
        .exec<{ kind: string }>("SELECT kind FROM writes_seen")
        .toArray()
        .map((row) => row.kind),
    }));
}

describe("open_batches", () => {
  it("never writes a row for a call that ends within the record delay", async () => {
    // eu-1 answers at once (no simulated time).
    const b = batcher({}, ["eu-1"]);
    const records = await watchRecords(b);
    const item = await readItem(b.stream("quick", { body: { max_tokens: 1 } }));
    expect(item.trailer).toMatchObject({ id: "quick", outcome: "ok" });
    // snapshot commits whatever is still queued.
    expect((await b.stub.snapshot()).persistedBatches).toBe(0);
    expect(await records()).toEqual({ rows: 0, writes: [] });
  });

  it("records a call once it has run for the record delay and deletes it when it ends", async () => {
    const b = batcher(HOLD);
    const records = await watchRecords(b);
    const occupier = await occupy(b);
    // Written by the queue's own timer, without a read that flushes it.
    let seen = await records();
    for (let i = 0; i < 100 && seen.rows === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, OPEN_BATCH_RECORD_DELAY_MS / 4));
      seen = await records();
    }
    expect(seen).toEqual({ rows: 1, writes: ["insert"] });
    await release(b, "occupier", occupier);
    for (let i = 0; i < 100 && seen.rows === 1; i++) {
      await new Promise((resolve) => setTimeout(resolve, OPEN_BATCH_RECORD_DELAY_MS / 4));
      seen = await records();
    }
    expect(seen).toEqual({ rows: 0, writes: ["insert", "delete"] });
  });
});

describe("restart", () => {
  it("ends every caller with an error, and cancels the orphaned calls on their origins", async () => {
    const b = batcher(HOLD);
    const before = await quiet("batch-1");
    const occupier = await occupy(b);
    const waiting = ["e1", "e2"].map((id) => b.stream(id));
    expect((await b.stub.snapshot()).queued).toBe(2);

    // The object goes away mid-window, as on a crash or a deploy.
    await abortAllDurableObjects();

    const ends = await Promise.all([occupier, ...waiting].map(readItem));
    // Nobody gets an answer: no HEAD for the waiting ones, no END for anyone, an error instead.
    // (The occupier's HEAD was read before.)
    expect(ends.map((end) => [end.head, end.trailer, typeof end.stopped])).toEqual([
      [null, null, "string"],
      [null, null, "string"],
      [null, null, "string"],
    ]);
    // A new incarnation finds the call the old one left open and cancels it once; the
    // alarm may already have run by itself.
    const stub = env.BATCHER.getByName(`test:${b.setup.version}`);
    await runDurableObjectAlarm(stub);
    const swept = await stub.snapshot();
    expect(swept.counters.submitted).toBe(0);
    expect(swept.persistedBatches).toBe(0);
    expect(swept.counters.orphansCancelled).toBe(1);
    await runDurableObjectAlarm(stub);
    expect((await stub.snapshot()).counters.orphansCancelled).toBe(1);
    // The origin ran only the occupier and has stopped it.
    const after = await waitForCounts("batch-1", (c) => c.inFlight === before.inFlight);
    expect([after.batches - before.batches, after.items - before.items]).toEqual([1, 1]);
    expect(after.inFlight).toBe(before.inFlight);
  });
});

describe("origin failures", () => {
  it("fails items before their HEAD when the origin cannot be reached, and skips it after", async () => {
    const setup: BatcherSetup = {
      version: `dead-${crypto.randomUUID().slice(0, 8)}`,
      region: "test",
      breakers: { enabled: false, settings: DEFAULT_BREAKER_SETTINGS },
      routing: null,
      window: windowConfig({ origins: [{ id: "dead" }, { id: "batch-2" }] }),
      origins: [
        { id: "dead", url: "http://127.0.0.1:9" },
        { id: "batch-2", url: urlOf("batch-2") },
      ],
      quarantineMs: 60_000,
      clientBacklogBytes: DEFAULT_BATCHING.clientBacklogBytes,
    };
    const stub = env.BATCHER.getByName(`test:${setup.version}`);
    const stream = (id: string) => {
      const { opening, ending } = openOn(stub, {
        setup,
        id,
        path: "/v1/chat/completions",
        body: JSON.stringify(chatBody({ stream: true, max_tokens: 2 })),
        headers: {},
        lane: 0,
        promptTokens: 30,
        maxTokens: 2,
        deadline: Date.now() + 60_000,
        firstByteTimeoutMs: 5_000,
        itemTimeoutMs: 60_000,
        avoidOrigins: [],
      });
      return openedFrames(opening, ending);
    };
    const first = await readItem(stream("f1"));
    expect(first.head).toBeNull();
    // Its call could not reach the origin at all: one silent when asked later is down.
    expect(first.trailer).toMatchObject({
      outcome: "error",
      origin: "dead",
      error: { code: "origin_unavailable" },
      unreachable: true,
    });
    const second = await readItem(stream("f2"));
    expect(second.head).toMatchObject({ status: 200, origin: "batch-2" });
  });
});
