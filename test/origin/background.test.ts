import { afterEach, describe, expect, it, vi } from "vitest";
import { BackgroundLane } from "../../origin/background.ts";
import type { EngineItem, EngineOutcome, EngineResponse } from "../../origin/engine.ts";
import { IDLE_LOAD } from "../../contracts/protocol/schema.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** An engine of `slots` running slots whose items end when the test says. */
function heldEngine(slots: number) {
  const running = new Map<string, () => void>();
  const submitted: string[] = [];
  const submit = (item: EngineItem): Promise<EngineResponse> => {
    submitted.push(item.id);
    const { promise: ended, resolve: end } = Promise.withResolvers<void>();
    running.set(item.id, end);
    item.signal.addEventListener("abort", () => end(), { once: true });
    const outcome = (async (): Promise<EngineOutcome> => {
      await ended;
      running.delete(item.id);
      const ok = !item.signal.aborted;
      // Each run has generated 5 tokens by the time it ends, whole or stopped.
      const usage = { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8, cached_tokens: 0 };
      return { outcome: ok ? "ok" : "cancelled", usage, queued_ms: 0, ttft_ms: 0 };
    })();
    return Promise.resolve({
      status: 200,
      headers: { "content-type": "application/json" },
      body: (async function* () {
        await ended;
        if (!item.signal.aborted) yield encoder.encode(`answer of ${item.id}`);
      })(),
      outcome,
    });
  };
  const load = () => ({ ...IDLE_LOAD, running: running.size, max_num_seqs: slots });
  return {
    submit,
    load,
    submitted,
    running,
    finish: (id: string) => running.get(id)?.(),
  };
}

function engineItem(id: string, signal = new AbortController().signal): EngineItem {
  return { id, path: "/v1/chat/completions", body: "{}", headers: {}, signal, priority: 0 };
}

async function text(response: EngineResponse | null): Promise<string> {
  if (response === null) return "aborted";
  let out = "";
  for await (const chunk of response.body) out += decoder.decode(chunk);
  return out;
}

const settle = () => new Promise((resolve) => setTimeout(resolve, 20));

describe("background items on an origin", () => {
  it("starts background items only into slots beyond the reserve that nothing else holds", async () => {
    const engine = heldEngine(10);
    const lane = new BackgroundLane(engine.load, { reserveShare: 0.2 });
    const runs = Array.from({ length: 12 }, (_, i) =>
      lane.run(engineItem(`line-${i}`), engine.submit).then(text),
    );
    await settle();
    // 10 slots less a reserve of 2: 8 start, 4 wait at the origin, none in the engine's queue.
    expect(engine.running.size).toBe(8);
    expect(lane.queued).toBe(4);
    engine.finish("line-0");
    await expect(runs[0]).resolves.toBe("answer of line-0");
    await settle();
    expect(engine.submitted).toContain("line-8");
    expect(lane.queued).toBe(3);
    for (let i = 1; i < 12; i++) engine.finish(`line-${i}`);
    await settle();
    for (let i = 1; i < 12; i++) engine.finish(`line-${i}`);
    await expect(Promise.all(runs)).resolves.toHaveLength(12);
  });

  it("holds background items while interactive requests take the slots", async () => {
    const engine = heldEngine(4);
    const lane = new BackgroundLane(engine.load, { reserveShare: 0 });
    for (const id of ["chat-1", "chat-2", "chat-3", "chat-4"]) {
      lane.interactiveStarted();
      void engine.submit(engineItem(id));
    }
    const line = lane.run(engineItem("line-0"), engine.submit).then(text);
    await settle();
    expect(engine.submitted).not.toContain("line-0");
    // The origin learns an item ended once the engine settled its outcome.
    engine.finish("chat-1");
    await settle();
    lane.interactiveEnded();
    await settle();
    expect(engine.submitted).toContain("line-0");
    engine.finish("line-0");
    await expect(line).resolves.toBe("answer of line-0");
  });

  it("stops the background item started last for an interactive request that finds no slot, and runs it again", async () => {
    const engine = heldEngine(2);
    const lane = new BackgroundLane(engine.load, { reserveShare: 0 });
    const first = lane.run(engineItem("line-0"), engine.submit).then(text);
    const second = lane.run(engineItem("line-1"), engine.submit).then(text);
    await settle();
    expect(engine.running.size).toBe(2);

    lane.interactiveStarted();
    void engine.submit(engineItem("chat-1"));
    await settle();
    expect(lane.preemptions).toBe(1);
    expect([...engine.running.keys()].sort()).toEqual(["chat-1", "line-0"]);
    expect(lane.queued).toBe(1);

    engine.finish("chat-1");
    await settle();
    lane.interactiveEnded();
    await settle();
    expect(engine.submitted.filter((id) => id === "line-1")).toHaveLength(2);
    engine.finish("line-0");
    engine.finish("line-1");
    // The stopped run's partial answer never leaves: each line answers once, whole.
    await expect(first).resolves.toBe("answer of line-0");
    await expect(second).resolves.toBe("answer of line-1");
    // Two lines run to the end; the stopped run's tokens were generated for nothing.
    expect(lane.okRuns).toBe(2);
    expect(lane.rerunTokens).toBe(5);
  });

  it("answers a background id it already answered from the kept answer, without running it", async () => {
    const engine = heldEngine(4);
    const lane = new BackgroundLane(engine.load);
    const first = lane.run(engineItem("batch_1-7"), engine.submit);
    await settle();
    engine.finish("batch_1-7");
    await expect(first.then(text)).resolves.toBe("answer of batch_1-7");

    const again = await lane.run(engineItem("batch_1-7"), engine.submit);
    expect(await again?.outcome).toMatchObject({ outcome: "ok", replayed: true });
    expect(await text(again)).toBe("answer of batch_1-7");
    expect(engine.submitted).toEqual(["batch_1-7"]);
    expect(lane.replays).toBe(1);
  });

  it("keeps no answer that did not end ok, and forgets kept answers past their time", async () => {
    const engine = heldEngine(4);
    const lane = new BackgroundLane(engine.load, { answerTtlMs: 0 });
    const controller = new AbortController();
    const cut = lane.run(engineItem("line-a", controller.signal), engine.submit);
    await settle();
    controller.abort();
    await cut;
    const kept = lane.run(engineItem("line-b"), engine.submit);
    await settle();
    engine.finish("line-b");
    await kept;

    const rerun = lane.run(engineItem("line-a"), engine.submit);
    const expired = lane.run(engineItem("line-b"), engine.submit);
    await settle();
    engine.finish("line-a");
    engine.finish("line-b");
    await Promise.all([rerun, expired]);
    expect(engine.submitted).toEqual(["line-a", "line-b", "line-a", "line-b"]);
  });

  it("returns null for an item aborted while it waited, without running it", async () => {
    const engine = heldEngine(1);
    const lane = new BackgroundLane(engine.load, { reserveShare: 0 });
    lane.interactiveStarted();
    void engine.submit(engineItem("chat-1"));
    const controller = new AbortController();
    const waiting = lane.run(engineItem("line-0", controller.signal), engine.submit);
    await settle();
    controller.abort();
    await expect(waiting).resolves.toBeNull();
    expect(engine.submitted).toEqual(["chat-1"]);
    expect(lane.queued).toBe(0);
  });
});

/** {@link heldEngine} whose load reports a step time and a prefill backlog the test sets. */
function steppedEngine(stepMs: number, slots = 10) {
  const engine = heldEngine(slots);
  const state = { backlog: 0 };
  const load = () => ({
    ...engine.load(),
    step_ms: stepMs,
    prefill_backlog_tokens: state.backlog,
  });
  return { ...engine, load, state };
}

describe("background items paced by the engine's steps", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("starts one background item per engine step, not a crowd at once", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const engine = steppedEngine(20);
    const lane = new BackgroundLane(engine.load, { reserveShare: 0.2 });
    for (let i = 0; i < 4; i++) void lane.run(engineItem(`line-${i}`), engine.submit);
    await vi.advanceTimersByTimeAsync(0);
    expect(engine.submitted).toEqual(["line-0"]);
    await vi.advanceTimersByTimeAsync(20);
    expect(engine.submitted).toEqual(["line-0", "line-1"]);
    await vi.advanceTimersByTimeAsync(40);
    expect(engine.submitted).toEqual(["line-0", "line-1", "line-2", "line-3"]);
    for (let i = 0; i < 4; i++) engine.finish(`line-${i}`);
    await vi.advanceTimersByTimeAsync(0);
    lane.close();
  });

  it("starts a larger engine's cap over a bounded number of steps, a few a step", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    // 256 slots less a 10% reserve: 230 background items at most, 8 a step.
    const engine = steppedEngine(20, 256);
    const lane = new BackgroundLane(engine.load, { reserveShare: 0.1 });
    for (let i = 0; i < 20; i++) void lane.run(engineItem(`line-${i}`), engine.submit);
    await vi.advanceTimersByTimeAsync(0);
    expect(engine.submitted).toHaveLength(8);
    await vi.advanceTimersByTimeAsync(20);
    expect(engine.submitted).toHaveLength(16);
    await vi.advanceTimersByTimeAsync(20);
    expect(engine.submitted).toHaveLength(20);
    for (let i = 0; i < 20; i++) engine.finish(`line-${i}`);
    await vi.advanceTimersByTimeAsync(0);
    lane.close();
  });

  it("starts no background item while the engine has prompt tokens waiting for prefill", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const engine = steppedEngine(5);
    engine.state.backlog = 700;
    const lane = new BackgroundLane(engine.load, { reserveShare: 0.2 });
    const run = lane.run(engineItem("line-0"), engine.submit).then(text);
    await vi.advanceTimersByTimeAsync(200);
    expect(engine.submitted).toEqual([]);
    expect(lane.queued).toBe(1);
    // The backlog prefilled: the item starts within a step, without any item event.
    engine.state.backlog = 0;
    await vi.advanceTimersByTimeAsync(5);
    expect(engine.submitted).toEqual(["line-0"]);
    engine.finish("line-0");
    await expect(run).resolves.toBe("answer of line-0");
    lane.close();
  });
});
