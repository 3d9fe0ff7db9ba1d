import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { DEFAULT_BREAKER_SETTINGS } from "../../../contracts/config/breakers.ts";
import {
  batcher,
  occupy,
  openedFrames,
  readItem,
  release,
  untilHead,
} from "../../support/batcher-harness.workers.ts";

// batch-narrow runs two sequences at once; with `maxOriginQueue: 1` the Batcher may have
// one more queued in its engine, and holds the rest in its lanes.
const NARROW = ["batch-narrow"];

type Harness = ReturnType<typeof batcher>;

/** Occupies both of the origin's slots and waits for its load report to say so. */
async function fill(b: Harness) {
  const first = await occupy(b, "busy-1");
  const second = await occupy(b, "busy-2");
  await waitFor(async () => (await b.stub.snapshot()).origins["batch-narrow"]?.running === 2);
  return { first, second };
}

async function waitFor(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error("condition never held");
}

describe("backpressure", () => {
  it("holds requests in its lane while the origin is full and sends them as its work ends", async () => {
    const b = batcher({ maxOriginQueue: 1 }, NARROW);
    const { first, second } = await fill(b);
    // One more fits the engine's own queue; the next waits in the lane.
    const queuedAtOrigin = b.stream("third");
    const held = b.stream("fourth");
    await waitFor(async () => (await b.stub.snapshot()).queued === 1);
    const snapshot = await b.stub.snapshot();
    expect(snapshot.recentBatches.flatMap((batch) => batch.items)).not.toContain("fourth");

    // A sequence ends: the held request leaves, and every accepted request is served whole.
    await release(b, "busy-1", first);
    expect(await untilHead(held)).toMatchObject({ id: "fourth", status: 200 });
    await release(b, "busy-2", second);
    expect((await readItem(queuedAtOrigin)).trailer).toMatchObject({ outcome: "ok" });
    expect((await readItem(held)).trailer).toMatchObject({ outcome: "ok" });
    expect((await b.stub.snapshot()).queued).toBe(0);
  });

  it("refuses at once with the lane's status and retry-after once the held lane is full", async () => {
    const b = batcher({ maxOriginQueue: 1, lanes: [{ maxQueue: 1 }] }, NARROW);
    const { first, second } = await fill(b);
    const third = b.stream("third");
    await waitFor(async () => (await b.stub.snapshot()).inFlight["batch-narrow"] === 3);
    const held = b.stream("held");
    await waitFor(async () => (await b.stub.snapshot()).queued === 1);
    const refused = await b.open("refused").opening;
    expect(refused).toMatchObject({ kind: "refused", reason: "queue_full", status: 503 });
    expect(refused.kind === "refused" && refused.retryAfterMs).toBeGreaterThanOrEqual(1000);
    await release(b, "busy-1", first);
    await release(b, "busy-2", second);
    expect((await readItem(third)).trailer).toMatchObject({ outcome: "ok" });
    expect((await readItem(held)).trailer).toMatchObject({ outcome: "ok" });
  });

  it("refuses what waits in its lanes at once when its region's last origin goes behind its breaker", async () => {
    // A first byte that waits behind the full engine is not taken for a slow origin here:
    // only the breaker may end the wait.
    const breakers = { ...DEFAULT_BREAKER_SETTINGS, slowFirstByteMs: 60_000 };
    const b = batcher({ maxOriginQueue: 1 }, NARROW, undefined, { breakers });
    // Two streams that run until released (about 20 ms a token, 2,000 tokens), read as they
    // come, fill both of the origin's slots; a third waits in its engine's queue.
    const long = { body: { max_tokens: 2000, ignore_eos: true }, maxTokens: 2000 };
    const first = b.stream("busy-1", long);
    const second = b.stream("busy-2", long);
    await untilHead(first);
    await untilHead(second);
    await waitFor(async () => (await b.stub.snapshot()).origins["batch-narrow"]?.running === 2);
    const running = [readItem(first), readItem(second)];
    const third = b.stream("third");
    await waitFor(async () => (await b.stub.snapshot()).inFlight["batch-narrow"] === 3);
    const held = b.open("held");
    await waitFor(async () => (await b.stub.snapshot()).queued === 1);

    const region = {
      id: b.setup.region,
      origins: b.setup.origins,
      settings: b.setup.breakers.settings,
    };
    // Opened elsewhere (an operator, the edge's own failures): the Batcher hears of it
    // within its copy's refresh age, a second, and nobody else has to ask it anything.
    await env.ORIGIN_BREAKERS.getByName(region.id).force(region, "batch-narrow", "open");
    // Refused, not left to wait out its lane's timeout (30 s, past this test's own).
    const item = await readItem(openedFrames(held.opening, held.ending));
    expect(item.head).toBeNull();
    expect(item.trailer).toMatchObject({ error: { code: "no_healthy_origin" } });
    expect(item.trailer).not.toHaveProperty("origin");
    const snapshot = await b.stub.snapshot();
    expect(snapshot.queued).toBe(0);
    expect(snapshot.counters.queuedNoOrigin).toBe(1);
    // A new request is refused at admission, as it is while no origin is usable.
    expect(await b.open("late").opening).toMatchObject({
      kind: "failed",
      code: "no_healthy_origin",
    });

    await release(b, "busy-1", first);
    await release(b, "busy-2", second);
    await release(b, "third", third);
    await Promise.all(running);
    await env.ORIGIN_BREAKERS.getByName(region.id).force(region, "batch-narrow", "closed");
  });
});
