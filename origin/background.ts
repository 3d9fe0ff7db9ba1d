/**
 * Background items on an origin (origin/PROTOCOL.md, "Background items"): items the edge
 * marks `background` (Batch API lines) wait here and enter the engine only into running
 * slots interactive items leave, beyond a reserve, a few per engine step and never while
 * prefill waits, so their prefill never lengthens a step much; an interactive item that finds
 * every slot taken preempts the background item started last (it runs again first). An
 * answer is whole before it leaves; one that ended `ok` is kept by item id for a while, and
 * the same id sent again gets it back without running (an edge restarted before storing it).
 */
import type { EngineItem, EngineOutcome, EngineResponse } from "./engine.ts";
import type { LoadReport } from "../contracts/protocol/schema.ts";

/** Default share of the engine's slots background items leave free. */
export const DEFAULT_BACKGROUND_RESERVE_SHARE = 0.1;
/** How long a background item's `ok` answer is kept, ms (as long as outcomes are). */
export const ANSWER_TTL_MS = 15 * 60_000;
/** Most bytes of kept answers; the oldest go first. */
export const MAX_ANSWER_BYTES = 256 * 1024 * 1024;
/** How often queued background items look for a free slot between item events, ms. */
const POLL_MS = 50;
/** Shortest wait before looking again for an item held back by the engine's step. */
const MIN_PACE_MS = 2;
/**
 * Steps over which background items may fill their whole cap: one item a step for an engine
 * of up to 32 slots, more for larger ones, so that short lines still keep every slot busy.
 */
export const BACKGROUND_REFILL_STEPS = 32;

/**
 * Most background items an engine of `maxNumSeqs` running slots runs at once, leaving
 * `reserveShare` of them to interactive items; one (and only alone) for an engine that
 * does not say its slots.
 */
export function backgroundCap(maxNumSeqs: number, reserveShare: number): number {
  return maxNumSeqs > 0 ? maxNumSeqs - Math.ceil(maxNumSeqs * reserveShare) : 1;
}

/** Limits of a {@link BackgroundLane}. */
export interface BackgroundOptions {
  /** Share of the engine's running slots left to interactive items (default 0.1). */
  reserveShare?: number;
  answerTtlMs?: number;
  maxAnswerBytes?: number;
}

/** An answer as it left: status, headers, body chunks and outcome. */
interface Answer {
  status: number;
  headers: Record<string, string>;
  chunks: Uint8Array[];
  outcome: EngineOutcome;
  bytes: number;
  keptAt: number;
}

interface Slot {
  controller: AbortController;
}

interface Waiter {
  signal: AbortSignal;
  resolve: (slot: Slot | null) => void;
}

/** Runs background items around interactive ones on one engine. */
export class BackgroundLane {
  readonly #load: () => Omit<LoadReport, "origin" | "t">;
  readonly #reserveShare: number;
  readonly #ttlMs: number;
  readonly #maxBytes: number;
  #queue: Waiter[] = [];
  /** Background items in the engine, oldest first. */
  #slots: Slot[] = [];
  #interactive = 0;
  #timer: ReturnType<typeof setTimeout> | null = null;
  /** When the timer fires (performance.now()). */
  #timerAt = 0;
  /** When the current step's window of starts began (performance.now()), and its starts. */
  #stepStart = Number.NEGATIVE_INFINITY;
  #stepStarts = 0;
  readonly #answers = new Map<string, Answer>();
  #answerBytes = 0;
  /** Background items stopped to give their slot to an interactive item. */
  preemptions = 0;
  /** Background items answered from a kept answer. */
  replays = 0;
  /** Background items run to the end `ok` (a replay is not a run). */
  okRuns = 0;
  /** Completion tokens that preempted runs had generated: thrown away, generated again. */
  rerunTokens = 0;

  constructor(load: () => Omit<LoadReport, "origin" | "t">, options: BackgroundOptions = {}) {
    this.#load = load;
    this.#reserveShare = options.reserveShare ?? DEFAULT_BACKGROUND_RESERVE_SHARE;
    this.#ttlMs = options.answerTtlMs ?? ANSWER_TTL_MS;
    this.#maxBytes = options.maxAnswerBytes ?? MAX_ANSWER_BYTES;
  }

  /** Background items waiting for a slot. */
  get queued(): number {
    return this.#queue.length;
  }

  /** Background items in the engine. */
  get running(): number {
    return this.#slots.length;
  }

  /** {@link backgroundCap} of the engine now: load reports carry it, and the edge sends up to it. */
  get cap(): number {
    return backgroundCap(this.#load().max_num_seqs, this.#reserveShare);
  }

  /**
   * An interactive item is about to enter the engine: when it would find no free slot,
   * the background item started last is stopped to make one (it runs again later).
   */
  interactiveStarted(): void {
    this.#interactive++;
    const load = this.#load();
    if (load.max_num_seqs <= 0) return;
    const occupied = Math.max(load.running + load.waiting + 1, this.#own());
    if (occupied <= load.max_num_seqs) return;
    const slot = this.#slots.pop();
    if (slot === undefined) return;
    this.preemptions++;
    slot.controller.abort();
  }

  /** An interactive item left the engine. */
  interactiveEnded(): void {
    this.#interactive = Math.max(0, this.#interactive - 1);
    this.#pump();
  }

  /**
   * Runs a background item: its kept answer when it has one, else once a slot is free,
   * again after each preemption, its body read whole. Null when the item was aborted
   * while it waited.
   */
  async run(
    item: EngineItem,
    submit: (item: EngineItem) => Promise<EngineResponse>,
  ): Promise<EngineResponse | null> {
    const kept = this.#kept(item.id);
    if (kept !== undefined) {
      this.replays++;
      return responseOf(kept, true);
    }
    const started = performance.now();
    for (let attempt = 0; ; attempt++) {
      const slot = await this.#acquire(item.signal, attempt > 0);
      if (slot === null) return null;
      let answer: Answer;
      try {
        const signal = AbortSignal.any([item.signal, slot.controller.signal]);
        answer = await readWhole(await submit({ ...item, signal }));
      } finally {
        this.#release(slot);
      }
      const preempted =
        slot.controller.signal.aborted && !item.signal.aborted && answer.outcome.outcome !== "ok";
      if (preempted) {
        this.rerunTokens += answer.outcome.usage?.completion_tokens ?? 0;
        continue;
      }
      // The time it waited here counts as queued, as it would in the engine's own queue.
      const queuedMs = performance.now() - started - (answer.outcome.ttft_ms ?? 0);
      answer.outcome = {
        ...answer.outcome,
        queued_ms: Math.max(answer.outcome.queued_ms, queuedMs),
      };
      if (answer.outcome.outcome === "ok") {
        this.okRuns++;
        this.#keep(item.id, answer);
      }
      return responseOf(answer, false);
    }
  }

  /** Stops the poll timer; queued items stay until their signals abort. */
  close(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #own(): number {
    return this.#interactive + this.#slots.length;
  }

  #acquire(signal: AbortSignal, front: boolean): Promise<Slot | null> {
    if (signal.aborted) return Promise.resolve(null);
    const { promise, resolve } = Promise.withResolvers<Slot | null>();
    const waiter: Waiter = { signal, resolve };
    if (front) this.#queue.unshift(waiter);
    else this.#queue.push(waiter);
    signal.addEventListener(
      "abort",
      () => {
        this.#queue = this.#queue.filter((w) => w !== waiter);
        resolve(null);
      },
      { once: true },
    );
    this.#pump();
    return promise;
  }

  #release(slot: Slot): void {
    this.#slots = this.#slots.filter((s) => s !== slot);
    this.#pump();
  }

  /**
   * Starts queued items while the engine has slots free beyond the reserve, paced by the
   * engine's steps and none while it has prompt tokens waiting for prefill, so that a step
   * takes a few background prefills instead of being lengthened by a crowd's.
   */
  #pump(): void {
    let retryMs = POLL_MS;
    while (this.#queue.length > 0) {
      const load = this.#load();
      const max = load.max_num_seqs;
      const cap = backgroundCap(max, this.#reserveShare);
      const occupied = max > 0 ? Math.max(load.running + load.waiting, this.#own()) : this.#own();
      if (occupied >= cap) break;
      const paceMs = this.#paceMs(load);
      if (paceMs > 0) {
        retryMs = Math.max(MIN_PACE_MS, paceMs);
        break;
      }
      const waiter = this.#queue.shift();
      if (waiter === undefined) break;
      const slot: Slot = { controller: new AbortController() };
      this.#slots.push(slot);
      this.#stepStarts++;
      waiter.resolve(slot);
    }
    if (this.#queue.length === 0) return;
    const at = performance.now() + retryMs;
    if (this.#timer !== null && this.#timerAt <= at) return;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timerAt = at;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#pump();
    }, retryMs);
  }

  /**
   * How long the next background item waits for the engine's step: an engine that reports
   * its step time takes a cap's worth over {@link BACKGROUND_REFILL_STEPS} steps (at least one
   * a step), and none while its prefill backlog is not empty.
   */
  #paceMs(load: Omit<LoadReport, "origin" | "t">): number {
    const stepMs = load.step_ms ?? 0;
    if (stepMs <= 0) return 0;
    if ((load.prefill_backlog_tokens ?? 0) > 0) return stepMs;
    const now = performance.now();
    if (now - this.#stepStart >= stepMs) {
      this.#stepStart = now;
      this.#stepStarts = 0;
    }
    const perStep = Math.ceil(
      backgroundCap(load.max_num_seqs, this.#reserveShare) / BACKGROUND_REFILL_STEPS,
    );
    return this.#stepStarts < Math.max(1, perStep) ? 0 : this.#stepStart + stepMs - now;
  }

  #kept(id: string): Answer | undefined {
    this.#expire(Date.now());
    return this.#answers.get(id);
  }

  #keep(id: string, answer: Answer): void {
    const old = this.#answers.get(id);
    if (old !== undefined) {
      this.#answers.delete(id);
      this.#answerBytes -= old.bytes;
    }
    answer.keptAt = Date.now();
    this.#answers.set(id, answer);
    this.#answerBytes += answer.bytes;
    this.#expire(answer.keptAt);
  }

  #expire(now: number): void {
    for (const [id, answer] of this.#answers) {
      if (now - answer.keptAt < this.#ttlMs && this.#answerBytes <= this.#maxBytes) break;
      this.#answers.delete(id);
      this.#answerBytes -= answer.bytes;
    }
  }
}

async function readWhole(response: EngineResponse): Promise<Answer> {
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  try {
    for await (const chunk of response.body) {
      chunks.push(chunk);
      bytes += chunk.byteLength;
    }
  } catch {
    // A body that throws has ended; the outcome says why.
  }
  const outcome = await response.outcome;
  return { status: response.status, headers: response.headers, chunks, outcome, bytes, keptAt: 0 };
}

function responseOf(answer: Answer, replayed: boolean): EngineResponse {
  const chunks = answer.chunks;
  return {
    status: answer.status,
    headers: { ...answer.headers },
    body: (async function* () {
      yield* chunks;
    })(),
    outcome: Promise.resolve(replayed ? { ...answer.outcome, replayed } : answer.outcome),
  };
}
