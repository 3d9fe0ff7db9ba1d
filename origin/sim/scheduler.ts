/**
 * Continuous batching like vLLM V1, as a pure core (docs/configuration.md, "The simulated
 * engine"): the caller passes `now` and gets back what one engine step did and how long it
 * takes. Each step's token budget is shared by decodes and chunked prefills; running
 * sequences first, waiting ones admitted by priority then arrival while slots, budget and
 * KV blocks last; when a running sequence cannot get a block, the lowest-priority,
 * latest-arrived one is preempted and recomputed later.
 */
import type { KvCache, SeqId } from "./kv-cache.ts";
import { type SimTiming, stepDurationMs } from "./timing.ts";

/** Limits of {@link Scheduler}. */
export interface SchedulerOptions {
  cache: KvCache;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  timing: SimTiming;
}

/** A sequence to run: its prompt and the output it will produce, token by token. */
export interface SeqSpec {
  id: SeqId;
  model: string;
  promptTokens: readonly number[];
  /** Planned output token ids; the sequence finishes after the last one. */
  outputTokens: readonly number[];
  /** Higher runs first. */
  priority: number;
}

/** Where a sequence is. */
export type SeqStatus = "waiting" | "running" | "finished" | "cancelled";

/** A sequence's progress, read-only to callers. */
export interface SeqState {
  readonly id: SeqId;
  readonly model: string;
  readonly status: SeqStatus;
  readonly promptTokens: number;
  readonly numComputed: number;
  readonly numGenerated: number;
  /** Prompt tokens the prefix cache served at first admission (null before it). */
  readonly cachedTokens: number | null;
  readonly arrivedAt: number;
  readonly firstScheduledAt: number | null;
  readonly firstTokenAt: number | null;
  readonly lastTokenAt: number | null;
  readonly preemptions: number;
}

interface Seq {
  id: SeqId;
  model: string;
  status: SeqStatus;
  priority: number;
  order: number;
  tokens: number[];
  promptLength: number;
  output: readonly number[];
  numComputed: number;
  numGenerated: number;
  cachedTokens: number | null;
  /** Prompt tokens not in the prefix cache when it arrived: its prefill still to come. */
  expectedUncached: number;
  arrivedAt: number;
  firstScheduledAt: number | null;
  firstTokenAt: number | null;
  lastTokenAt: number | null;
  preemptions: number;
}

/** One token a step produced; `index` counts from 0 within the sequence's output. */
export interface EmittedToken {
  seq: SeqId;
  index: number;
}

/** What one step did. Tokens and finishes take effect at `endsAt`. */
export interface StepResult {
  startedAt: number;
  durationMs: number;
  endsAt: number;
  /** Prompt (or recomputed) tokens computed. */
  prefillTokens: number;
  /** Sequences that decoded one token. */
  decodeSeqs: number;
  /** Context tokens attention read. */
  contextTokens: number;
  /** Sequences in the batch. */
  batchSize: number;
  /** Sequences admitted from the waiting queue this step, with their prefix-cache hit. */
  admitted: { seq: SeqId; queriedTokens: number; cachedTokens: number; firstTime: boolean }[];
  tokens: EmittedToken[];
  finished: SeqId[];
  preempted: SeqId[];
}

/** The continuous-batching scheduler over a {@link KvCache}. */
export class Scheduler {
  readonly cache: KvCache;
  readonly maxNumSeqs: number;
  readonly maxNumBatchedTokens: number;
  readonly timing: SimTiming;
  /** Preemptions since start. */
  preemptions = 0;

  #waiting: Seq[] = [];
  #running: Seq[] = [];
  readonly #seqs = new Map<SeqId, Seq>();
  #arrivals = 0;

  constructor(options: SchedulerOptions) {
    this.cache = options.cache;
    this.maxNumSeqs = options.maxNumSeqs;
    this.maxNumBatchedTokens = options.maxNumBatchedTokens;
    this.timing = options.timing;
  }

  /** Sequences in the running batch. */
  get numRunning(): number {
    return this.#running.length;
  }

  /** Sequences waiting for a slot, budget or KV blocks. */
  get numWaiting(): number {
    return this.#waiting.length;
  }

  /**
   * Prompt tokens still to prefill: what waiting sequences did not find cached when they
   * arrived, and what running ones have left of their prompt.
   */
  get prefillBacklog(): number {
    let tokens = 0;
    for (const seq of this.#waiting) {
      tokens += seq.numComputed > 0 ? seq.tokens.length - seq.numComputed : seq.expectedUncached;
    }
    for (const seq of this.#running) tokens += Math.max(0, seq.promptLength - seq.numComputed);
    return tokens;
  }

  /** Whether a step would do anything. */
  get hasWork(): boolean {
    return this.#running.length > 0 || this.#waiting.length > 0;
  }

  /** Queues a sequence. The id must be new. */
  add(spec: SeqSpec, now: number): void {
    if (this.#seqs.has(spec.id)) throw new Error(`duplicate sequence id ${spec.id}`);
    if (spec.outputTokens.length === 0) throw new Error(`sequence ${spec.id} has no output`);
    const seq: Seq = {
      id: spec.id,
      model: spec.model,
      status: "waiting",
      priority: spec.priority,
      order: this.#arrivals++,
      tokens: [...spec.promptTokens],
      promptLength: spec.promptTokens.length,
      output: spec.outputTokens,
      numComputed: 0,
      numGenerated: 0,
      cachedTokens: null,
      expectedUncached:
        spec.promptTokens.length - this.cache.lookup(spec.model, spec.promptTokens).tokens,
      arrivedAt: now,
      firstScheduledAt: null,
      firstTokenAt: null,
      lastTokenAt: null,
      preemptions: 0,
    };
    this.#seqs.set(seq.id, seq);
    this.#enqueue(seq);
  }

  /** Removes a sequence at once and frees its blocks. False if it had already ended. */
  cancel(id: SeqId): boolean {
    const seq = this.#seqs.get(id);
    if (seq === undefined) return false;
    this.#seqs.delete(id);
    this.#waiting = this.#waiting.filter((s) => s !== seq);
    this.#running = this.#running.filter((s) => s !== seq);
    this.cache.free(id);
    seq.status = "cancelled";
    return true;
  }

  /** A live sequence's progress (finished and cancelled ones are forgotten). */
  get(id: SeqId): SeqState | undefined {
    const seq = this.#seqs.get(id);
    if (seq === undefined) return undefined;
    return {
      id: seq.id,
      model: seq.model,
      status: seq.status,
      promptTokens: seq.promptLength,
      numComputed: seq.numComputed,
      numGenerated: seq.numGenerated,
      cachedTokens: seq.cachedTokens,
      arrivedAt: seq.arrivedAt,
      firstScheduledAt: seq.firstScheduledAt,
      firstTokenAt: seq.firstTokenAt,
      lastTokenAt: seq.lastTokenAt,
      preemptions: seq.preemptions,
    };
  }

  /** Plans and applies one step; null when nothing can run. */
  step(now: number): StepResult | null {
    let budget = this.maxNumBatchedTokens;
    const scheduled = new Map<Seq, number>();
    const preempted: SeqId[] = [];
    const admitted: StepResult["admitted"] = [];

    for (let i = 0; i < this.#running.length && budget > 0;) {
      const seq = this.#running[i];
      if (seq === undefined) break;
      const numNew = Math.min(seq.tokens.length - seq.numComputed, budget);
      let fits = false;
      for (;;) {
        if (this.cache.allocate(seq.id, seq.model, seq.numComputed + numNew).ok) {
          fits = true;
          break;
        }
        const victim = this.#pickVictim(i);
        if (victim === undefined) break;
        this.#preempt(victim);
        preempted.push(victim.id);
        if (victim === seq) break;
      }
      if (!fits) continue; // seq preempted itself; index i now holds the next one
      scheduled.set(seq, numNew);
      budget -= numNew;
      i++;
    }

    // vLLM admits nothing in a step that had to preempt: memory is the bottleneck.
    while (
      preempted.length === 0 &&
      budget > 0 &&
      this.#running.length < this.maxNumSeqs &&
      this.#waiting.length > 0
    ) {
      const seq = this.#waiting[0];
      if (seq === undefined) break;
      const hit = this.cache.lookup(seq.model, seq.tokens);
      const numNew = Math.min(seq.tokens.length - hit.tokens, budget);
      const result = this.cache.allocate(
        seq.id,
        seq.model,
        hit.tokens + numNew,
        hit,
        seq.tokens.length,
      );
      if (!result.ok) break;
      this.#waiting.shift();
      this.#running.push(seq);
      seq.status = "running";
      seq.numComputed = hit.tokens;
      const firstTime = seq.cachedTokens === null;
      if (firstTime) seq.cachedTokens = hit.tokens;
      seq.firstScheduledAt ??= now;
      admitted.push({
        seq: seq.id,
        queriedTokens: seq.tokens.length,
        cachedTokens: hit.tokens,
        firstTime,
      });
      scheduled.set(seq, numNew);
      budget -= numNew;
    }

    if (scheduled.size === 0) {
      if (preempted.length === 0) return null;
      // Everything got preempted (memory too small for the batch); retry admission next step.
      return this.#result(now, 0, 0, 0, 0, admitted, [], [], preempted);
    }

    let prefillTokens = 0;
    let decodeSeqs = 0;
    let contextTokens = 0;
    for (const [seq, numNew] of scheduled) {
      const decoding =
        numNew === 1 && seq.numGenerated > 0 && seq.numComputed === seq.tokens.length - 1;
      if (decoding) decodeSeqs++;
      else prefillTokens += numNew;
      contextTokens += seq.numComputed + numNew;
    }
    const durationMs = stepDurationMs(this.timing, prefillTokens, decodeSeqs, contextTokens);
    const endsAt = now + durationMs;

    const tokens: EmittedToken[] = [];
    const finished: SeqId[] = [];
    for (const [seq, numNew] of scheduled) {
      seq.numComputed += numNew;
      this.cache.commit(seq.id, seq.tokens, seq.numComputed);
      if (seq.numComputed < seq.tokens.length) continue; // chunked prefill continues next step
      const index = seq.numGenerated;
      seq.tokens.push(seq.output[index] ?? 0);
      seq.numGenerated++;
      seq.firstTokenAt ??= endsAt;
      seq.lastTokenAt = endsAt;
      tokens.push({ seq: seq.id, index });
      if (seq.numGenerated >= seq.output.length) {
        seq.status = "finished";
        this.cache.free(seq.id);
        this.#seqs.delete(seq.id);
        finished.push(seq.id);
      }
    }
    if (finished.length > 0) this.#running = this.#running.filter((s) => s.status === "running");

    return this.#result(
      now,
      prefillTokens,
      decodeSeqs,
      contextTokens,
      scheduled.size,
      admitted,
      tokens,
      finished,
      preempted,
    );
  }

  #result(
    now: number,
    prefillTokens: number,
    decodeSeqs: number,
    contextTokens: number,
    batchSize: number,
    admitted: StepResult["admitted"],
    tokens: EmittedToken[],
    finished: SeqId[],
    preempted: SeqId[],
  ): StepResult {
    const durationMs =
      batchSize === 0 ? 0 : stepDurationMs(this.timing, prefillTokens, decodeSeqs, contextTokens);
    return {
      startedAt: now,
      durationMs,
      endsAt: now + durationMs,
      prefillTokens,
      decodeSeqs,
      contextTokens,
      batchSize,
      admitted,
      tokens,
      finished,
      preempted,
    };
  }

  /** Lowest priority, then latest arrival, among running sequences not yet scheduled. */
  #pickVictim(from: number): Seq | undefined {
    let victim: Seq | undefined;
    for (let i = from; i < this.#running.length; i++) {
      const seq = this.#running[i];
      if (seq === undefined) continue;
      if (
        victim === undefined ||
        seq.priority < victim.priority ||
        (seq.priority === victim.priority && seq.order > victim.order)
      ) {
        victim = seq;
      }
    }
    return victim;
  }

  #preempt(seq: Seq): void {
    this.#running = this.#running.filter((s) => s !== seq);
    this.cache.free(seq.id);
    seq.numComputed = 0;
    seq.preemptions++;
    this.preemptions++;
    this.#enqueue(seq);
  }

  #enqueue(seq: Seq): void {
    seq.status = "waiting";
    let at = this.#waiting.length;
    while (at > 0) {
      const before = this.#waiting[at - 1];
      if (before === undefined) break;
      if (before.priority > seq.priority) break;
      if (before.priority === seq.priority && before.order < seq.order) break;
      at--;
    }
    this.#waiting.splice(at, 0, seq);
  }
}
