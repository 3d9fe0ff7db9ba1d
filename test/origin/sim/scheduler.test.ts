import { describe, expect, it } from "vitest";
import { KvCache } from "../../../origin/sim/kv-cache.ts";
import {
  Scheduler,
  type SchedulerOptions,
  type StepResult,
} from "../../../origin/sim/scheduler.ts";
import { DEFAULT_SIM_TIMING } from "../../../origin/sim/timing.ts";

function makeScheduler(
  options: Partial<Omit<SchedulerOptions, "cache">> & { kvBlocks?: number } = {},
) {
  return new Scheduler({
    cache: new KvCache({ numBlocks: options.kvBlocks ?? 4096, blockSize: 16 }),
    maxNumSeqs: options.maxNumSeqs ?? 64,
    maxNumBatchedTokens: options.maxNumBatchedTokens ?? 2048,
    timing: options.timing ?? DEFAULT_SIM_TIMING,
  });
}

/** Distinct tokens: `length` of them starting at `start`. */
function tokens(length: number, start: number): number[] {
  return Array.from({ length }, (_, i) => start + i);
}

function output(length: number): number[] {
  return Array.from({ length }, (_, i) => 50_000 + i);
}

interface Trace {
  end: number;
  steps: StepResult[];
  /** Simulated time of every token of every sequence. */
  tokenTimes: Map<string, number[]>;
  maxRunning: number;
}

/** Steps the scheduler in simulated time until it is idle. */
function drain(scheduler: Scheduler, start = 0, limit = 100_000): Trace {
  const trace: Trace = { end: start, steps: [], tokenTimes: new Map(), maxRunning: 0 };
  let now = start;
  for (let i = 0; i < limit; i++) {
    const step = scheduler.step(now);
    if (step === null) break;
    trace.steps.push(step);
    trace.maxRunning = Math.max(trace.maxRunning, scheduler.numRunning + step.finished.length);
    for (const token of step.tokens) {
      const times = trace.tokenTimes.get(token.seq) ?? [];
      times.push(step.endsAt);
      trace.tokenTimes.set(token.seq, times);
    }
    now = step.endsAt;
  }
  trace.end = now;
  return trace;
}

function ttft(trace: Trace, seq: string, arrivedAt = 0): number {
  const first = trace.tokenTimes.get(seq)?.[0];
  if (first === undefined) throw new Error(`${seq} produced no token`);
  return first - arrivedAt;
}

function meanItl(trace: Trace, seq: string): number {
  const times = trace.tokenTimes.get(seq) ?? [];
  const gaps = times.slice(1).map((t, i) => t - (times[i] ?? 0));
  return gaps.reduce((a, b) => a + b, 0) / gaps.length;
}

/** Smallest step between neighbours: positive when the values rise strictly. */
function smallestRise(values: number[]): number {
  return Math.min(...values.slice(1).map((v, i) => v - (values[i] ?? Infinity)));
}

/** Runs four waves of 16 requests with a 1536-token system prompt, shared or not. */
function makespan(shared: boolean): { end: number; prefill: number } {
  const scheduler = makeScheduler();
  let now = 0;
  let prefill = 0;
  // Waves of requests with a 1536-token system prompt, as a chat product sends.
  for (let wave = 0; wave < 4; wave++) {
    for (let i = 0; i < 16; i++) {
      const system = tokens(1536, shared ? 0 : (wave * 16 + i) * 10_000);
      scheduler.add(
        {
          id: `w${wave}-${i}`,
          model: "m",
          promptTokens: [...system, ...tokens(64, 5_000_000 + (wave * 16 + i) * 100)],
          outputTokens: output(16),
          priority: 0,
        },
        now,
      );
    }
    const trace = drain(scheduler, now);
    prefill += trace.steps.reduce((sum, s) => sum + s.prefillTokens, 0);
    now = trace.end;
  }
  return { end: now, prefill };
}

describe("Scheduler timing model", () => {
  it("takes longer to the first token as the uncached prompt grows", () => {
    const ttfts = [64, 512, 2048, 8192].map((length) => {
      const scheduler = makeScheduler();
      scheduler.add(
        {
          id: "a",
          model: "m",
          promptTokens: tokens(length, 0),
          outputTokens: output(4),
          priority: 0,
        },
        0,
      );
      return ttft(drain(scheduler), "a");
    });
    expect(smallestRise(ttfts)).toBeGreaterThan(0);
  });

  it("takes longer to the first token as the queue ahead grows", () => {
    const ttfts = [1, 4, 16, 64].map((depth) => {
      const scheduler = makeScheduler();
      for (let i = 0; i < depth; i++) {
        scheduler.add(
          {
            id: `s${i}`,
            model: "m",
            promptTokens: tokens(1024, i * 10_000),
            outputTokens: output(8),
            priority: 0,
          },
          0,
        );
      }
      return ttft(drain(scheduler), `s${depth - 1}`);
    });
    expect(smallestRise(ttfts)).toBeGreaterThan(0);
  });

  it("takes longer between tokens as the running batch grows", () => {
    const itls = [1, 8, 32, 64].map((batch) => {
      const scheduler = makeScheduler();
      for (let i = 0; i < batch; i++) {
        scheduler.add(
          {
            id: `s${i}`,
            model: "m",
            promptTokens: tokens(32, i * 1000),
            outputTokens: output(64),
            priority: 0,
          },
          0,
        );
      }
      return meanItl(drain(scheduler), "s0");
    });
    expect(smallestRise(itls)).toBeGreaterThan(0);
  });

  it("answers faster when the prompt's prefix is already cached", () => {
    const scheduler = makeScheduler();
    const prompt = tokens(4000, 0);
    scheduler.add(
      { id: "cold", model: "m", promptTokens: prompt, outputTokens: output(4), priority: 0 },
      0,
    );
    const cold = drain(scheduler);
    const start = cold.end;
    scheduler.add(
      { id: "warm", model: "m", promptTokens: prompt, outputTokens: output(4), priority: 0 },
      start,
    );
    expect(scheduler.get("warm")?.cachedTokens).toBeNull();
    const warmTrace = drain(scheduler, start);
    expect(ttft(warmTrace, "warm", start)).toBeLessThan(ttft(cold, "cold"));
    const later = warmTrace.end;
    scheduler.add(
      {
        id: "half",
        model: "m",
        promptTokens: [...prompt.slice(0, 2000), ...tokens(2000, 90_000)],
        outputTokens: output(4),
        priority: 0,
      },
      later,
    );
    const halfTrace = drain(scheduler, later);
    expect(ttft(halfTrace, "half", later)).toBeGreaterThan(ttft(warmTrace, "warm", start));
    expect(ttft(halfTrace, "half", later)).toBeLessThan(ttft(cold, "cold"));
    expect(scheduler.cache.prefixHits).toBe(3984 + 2000);
  });

  it("loses throughput when long shared prefixes are recomputed instead of cached", () => {
    const cached = makespan(true);
    const recomputed = makespan(false);
    expect(recomputed.prefill).toBeGreaterThan(cached.prefill * 5);
    expect(recomputed.end).toBeGreaterThan(cached.end * 2);
  });
});

describe("Scheduler batching", () => {
  it("never computes more tokens in a step than the batch budget", () => {
    const scheduler = makeScheduler({ maxNumBatchedTokens: 512 });
    for (let i = 0; i < 8; i++) {
      scheduler.add(
        {
          id: `s${i}`,
          model: "m",
          promptTokens: tokens(700, i * 1000),
          outputTokens: output(10),
          priority: 0,
        },
        0,
      );
    }
    const trace = drain(scheduler);
    for (const step of trace.steps)
      expect(step.prefillTokens + step.decodeSeqs).toBeLessThanOrEqual(512);
    expect(trace.tokenTimes.size).toBe(8);
  });

  it("keeps decoding running sequences while a long prompt is prefilled in chunks", () => {
    const scheduler = makeScheduler({ maxNumBatchedTokens: 256 });
    scheduler.add(
      {
        id: "short",
        model: "m",
        promptTokens: tokens(10, 0),
        outputTokens: output(40),
        priority: 0,
      },
      0,
    );
    scheduler.step(0);
    scheduler.add(
      {
        id: "long",
        model: "m",
        promptTokens: tokens(4000, 10_000),
        outputTokens: output(2),
        priority: 0,
      },
      0,
    );
    const trace = drain(scheduler, 1);
    const prefillSteps = trace.steps.filter((s) => s.prefillTokens > 0);
    expect(prefillSteps.length).toBeGreaterThan(10);
    // Every chunked-prefill step also carried the short sequence's decode.
    for (const step of prefillSteps.slice(0, 10)) expect(step.decodeSeqs).toBe(1);
  });

  it("runs at most max_num_seqs sequences at once", () => {
    const scheduler = makeScheduler({ maxNumSeqs: 4 });
    for (let i = 0; i < 20; i++) {
      scheduler.add(
        {
          id: `s${i}`,
          model: "m",
          promptTokens: tokens(20, i * 100),
          outputTokens: output(5),
          priority: 0,
        },
        0,
      );
    }
    scheduler.step(0);
    expect(scheduler.numRunning).toBe(4);
    expect(scheduler.numWaiting).toBe(16);
    const trace = drain(scheduler, 1);
    expect(trace.maxRunning).toBeLessThanOrEqual(4);
    expect(trace.tokenTimes.size).toBe(20);
  });

  it("admits waiting sequences by priority, then by arrival", () => {
    const scheduler = makeScheduler({ maxNumSeqs: 1 });
    const add = (id: string, priority: number) =>
      scheduler.add(
        {
          id,
          model: "m",
          promptTokens: tokens(20, id.length * 100),
          outputTokens: output(1),
          priority,
        },
        0,
      );
    add("low-1", 0);
    add("low-2", 0);
    add("high", 5);
    const order = drain(scheduler).steps.flatMap((s) => s.admitted.map((a) => a.seq));
    expect(order).toEqual(["high", "low-1", "low-2"]);
  });

  it("keeps new requests waiting while KV memory is full", () => {
    const scheduler = makeScheduler({ kvBlocks: 10 });
    scheduler.add(
      { id: "a", model: "m", promptTokens: tokens(140, 0), outputTokens: output(4), priority: 0 },
      0,
    );
    scheduler.add(
      {
        id: "b",
        model: "m",
        promptTokens: tokens(100, 1000),
        outputTokens: output(4),
        priority: 0,
      },
      0,
    );
    const first = scheduler.step(0);
    expect(first?.admitted.map((a) => a.seq)).toEqual(["a"]);
    expect(scheduler.numWaiting).toBe(1);
    const trace = drain(scheduler, first?.endsAt ?? 0);
    expect(trace.tokenTimes.get("b")).toHaveLength(4);
    expect(scheduler.cache.referencedBlocks).toBe(0);
  });

  it("preempts the latest lowest-priority sequence when decode runs out of blocks, then finishes it", () => {
    const scheduler = makeScheduler({ kvBlocks: 12 });
    scheduler.add(
      {
        id: "early",
        model: "m",
        promptTokens: tokens(60, 0),
        outputTokens: output(60),
        priority: 0,
      },
      0,
    );
    scheduler.add(
      {
        id: "late",
        model: "m",
        promptTokens: tokens(60, 1000),
        outputTokens: output(60),
        priority: 0,
      },
      0,
    );
    const trace = drain(scheduler);
    const preempted = trace.steps.flatMap((s) => s.preempted);
    expect(preempted.length).toBeGreaterThan(0);
    expect(preempted[0]).toBe("late");
    expect(scheduler.preemptions).toBe(preempted.length);
    expect(trace.tokenTimes.get("early")).toHaveLength(60);
    expect(trace.tokenTimes.get("late")).toHaveLength(60);
    expect(scheduler.cache.referencedBlocks).toBe(0);
  });

  it("frees the slot and the blocks of a cancelled sequence at once", () => {
    const scheduler = makeScheduler({ maxNumSeqs: 1 });
    scheduler.add(
      { id: "a", model: "m", promptTokens: tokens(100, 0), outputTokens: output(50), priority: 0 },
      0,
    );
    scheduler.add(
      {
        id: "b",
        model: "m",
        promptTokens: tokens(100, 1000),
        outputTokens: output(5),
        priority: 0,
      },
      0,
    );
    scheduler.step(0);
    expect(scheduler.cache.referencedBlocks).toBeGreaterThan(0);
    expect(scheduler.cancel("a")).toBe(true);
    expect(scheduler.cancel("a")).toBe(false);
    expect(scheduler.numRunning).toBe(0);
    expect(scheduler.cache.referencedBlocks).toBe(0);
    const trace = drain(scheduler, 10);
    expect(trace.tokenTimes.get("b")).toHaveLength(5);
    expect(trace.tokenTimes.has("a")).toBe(false);
  });
});

function spec(id: string, prompt: number[]) {
  return { id, model: "m", promptTokens: prompt, outputTokens: output(2), priority: 0 };
}

describe("prefill backlog", () => {
  it("counts what waiting and running sequences have left to prefill, cached prefixes not", () => {
    const scheduler = makeScheduler({ maxNumBatchedTokens: 1024 });
    scheduler.add(spec("a", tokens(3000, 0)), 0);
    expect(scheduler.prefillBacklog).toBe(3000);
    scheduler.step(0);
    // One step of 1024 tokens done; 1976 left.
    expect(scheduler.prefillBacklog).toBe(1976);
    drain(scheduler, 1);
    expect(scheduler.prefillBacklog).toBe(0);
    // The same prompt again: its cached blocks are no backlog (the last block is recomputed).
    scheduler.add(spec("b", tokens(3000, 0)), 10_000);
    expect(scheduler.prefillBacklog).toBeLessThan(32);
  });
});
