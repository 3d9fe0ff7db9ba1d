/**
 * The simulated inference engine (docs/configuration.md, "The simulated engine"): parses
 * OpenAI requests, plans deterministic output, and runs every sequence through the paged
 * KV cache and the continuous-batching scheduler, releasing each token when its simulated
 * step ends.
 */
import type {
  EngineBlockEvent,
  EngineHealth,
  EngineItem,
  EngineModel,
  EngineOutcome,
  EngineResponse,
} from "../engine.ts";
import { randomInt } from "node:crypto";
import type { LoadReport } from "../../contracts/protocol/schema.ts";
import { engineBlockEvent, prefillSpeed } from "./block-events.ts";
import { KvCache, type SeqId } from "./kv-cache.ts";
import { SimMetrics } from "./metrics.ts";
import {
  type ResolvedSimEngineOptions,
  type SimEngine,
  type SimEngineOptions,
  resolveSimEngineOptions,
} from "./options.ts";
import { parseRequest, type OpenAIError } from "./request.ts";
import {
  type Choice,
  JSON_HEADERS,
  type Run,
  SSE_HEADERS,
  errorResponse,
  planChoices,
  newRun,
  outcomeOf,
  requestHash,
} from "./run.ts";
import { Scheduler } from "./scheduler.ts";
import { finalChunks, releaseTokens } from "./render.ts";

/** Weight of the newest step in the reported mean step time. */
const STEP_MS_WEIGHT = 0.2;

function serverError(message: string): OpenAIError {
  return { message, type: "server_error", param: null, code: null };
}
/** What a run hears when the engine fails under it (a bug, never the client's input). */
const ENGINE_FAILED = serverError("The engine failed while running the request.");

class SimEngineImpl implements SimEngine {
  readonly kind = "sim";
  readonly options: ResolvedSimEngineOptions;
  readonly #cache: KvCache;
  readonly #scheduler: Scheduler;
  readonly #runs = new Set<Run>();
  readonly #bySeq = new Map<SeqId, { run: Run; choice: Choice }>();
  #seqCounter = 0;
  // Decaying mean of the steps' duration in real ms (0 without simulated time).
  #stepMs = 0;
  #closed = false;
  #wakeLoop: (() => void) | null = null;
  #sleepTimer: ReturnType<typeof setTimeout> | null = null;
  #endSleep: (() => void) | null = null;
  readonly #loop: Promise<void>;

  readonly #metrics: SimMetrics;

  constructor(options: SimEngineOptions) {
    this.options = resolveSimEngineOptions(options);
    this.#cache = new KvCache({
      numBlocks: this.options.kvBlocks,
      blockSize: this.options.blockSize,
    });
    this.#scheduler = new Scheduler({
      cache: this.#cache,
      maxNumSeqs: this.options.maxNumSeqs,
      maxNumBatchedTokens: this.options.maxNumBatchedTokens,
      timing: this.options.timing,
    });
    this.#metrics = new SimMetrics(this.options.models);
    this.#loop = this.#run();
  }

  onBlocks(listener: (event: EngineBlockEvent) => void): void {
    this.#cache.onEvent = (event) => {
      const entry = event.kind === "stored" ? this.#bySeq.get(event.seq) : undefined;
      const out = engineBlockEvent(event, entry, this.#cache.blockSize);
      if (out !== null) listener(out);
    };
  }

  models(): EngineModel[] {
    return this.options.models.map((m) => ({
      id: m.id,
      max_model_len: m.max_model_len,
      owned_by: "warmgate",
    }));
  }

  async submit(item: EngineItem): Promise<EngineResponse> {
    if (this.#closed) {
      return errorResponse(503, serverError("The engine is shutting down."));
    }
    const parsed = parseRequest(item.path, item.body, this.options.models);
    if (!parsed.ok) return errorResponse(parsed.status, parsed.error);
    const request = parsed.request;
    // Without a seed, each request samples anew, as a real engine does.
    const nonce = request.seed === null && !this.options.deterministic ? randomInt(2 ** 47) : null;
    const hashes = requestHash(this.options.seed, request, nonce);
    const choices = planChoices(request, this.options, () => `${++this.#seqCounter}`, hashes);
    if (!Array.isArray(choices)) return choices;

    const { promise: outcome, resolve: settle } = Promise.withResolvers<EngineOutcome>();
    const run: Run = newRun(item, request, choices, this.options, settle, hashes);
    run.onAbort = () => this.#cancel(run);

    if (item.signal.aborted) {
      run.state = "cancelled";
      this.#settle(run);
    } else {
      this.#runs.add(run);
      item.signal.addEventListener("abort", run.onAbort, { once: true });
      const now = performance.now();
      for (const choice of choices) {
        this.#bySeq.set(choice.seq, { run, choice });
        this.#scheduler.add(
          {
            id: choice.seq,
            model: request.model.id,
            promptTokens: request.prompts[choice.promptIndex] ?? [],
            outputTokens: choice.plan.ids,
            priority: item.priority,
          },
          now,
        );
      }
      this.#wakeLoop?.();
    }

    return {
      status: 200,
      headers: request.stream ? { ...SSE_HEADERS } : { ...JSON_HEADERS },
      body: this.#body(run),
      outcome,
    };
  }

  load(): Omit<LoadReport, "origin" | "t"> {
    return {
      running: this.#scheduler.numRunning,
      waiting: this.#scheduler.numWaiting,
      kv_usage: this.#cache.usage,
      kv_free_blocks: this.#cache.freeBlocks,
      kv_total_blocks: this.#cache.numBlocks,
      block_size: this.#cache.blockSize,
      prefix_queries: this.#cache.prefixQueries,
      prefix_hits: this.#cache.prefixHits,
      max_num_seqs: this.#scheduler.maxNumSeqs,
      step_ms: Math.round(this.#stepMs * 100) / 100,
      ...prefillSpeed(this.options),
      prefill_backlog_tokens: this.#scheduler.prefillBacklog,
    };
  }

  metrics(): string {
    const running = new Map<string, number>();
    const waiting = new Map<string, number>();
    for (const model of this.options.models) {
      running.set(model.id, 0);
      waiting.set(model.id, 0);
    }
    for (const { run, choice } of this.#bySeq.values()) {
      const state = this.#scheduler.get(choice.seq);
      const target =
        state?.status === "running" ? running : state?.status === "waiting" ? waiting : null;
      if (target !== null) target.set(run.head.model, (target.get(run.head.model) ?? 0) + 1);
    }
    return this.#metrics.render(this.options.models, running, waiting, this.#cache.usage);
  }

  async health(): Promise<EngineHealth> {
    return {
      ok: !this.#closed,
      engine: "sim",
      detail: `simulated engine: ${this.options.kvBlocks} KV blocks of ${this.options.blockSize} tokens (simulated GPU memory)`,
    };
  }

  async close(): Promise<void> {
    if (this.#closed) return this.#loop;
    this.#closed = true;
    for (const run of this.#runs) {
      this.#fail(run, serverError("The engine shut down before the request finished."));
    }
    if (this.#sleepTimer !== null) clearTimeout(this.#sleepTimer);
    this.#endSleep?.();
    this.#wakeLoop?.();
    return this.#loop;
  }

  async *#body(run: Run): AsyncGenerator<Uint8Array> {
    try {
      for (;;) {
        const chunk = run.queue.shift();
        if (chunk !== undefined) {
          yield chunk;
          continue;
        }
        if (run.state !== "active") break;
        await new Promise<void>((resolve) => {
          run.wake = resolve;
        });
        run.wake = null;
      }
    } finally {
      // The reader stopped early (connection gone): the sequences must not keep running.
      if (run.state === "active") this.#cancel(run);
      this.#settle(run);
    }
  }

  #push(run: Run, bytes: Uint8Array): void {
    run.ttftMs ??= performance.now() - run.submittedAt;
    run.queue.push(bytes);
    run.wake?.();
  }

  #settle(run: Run): void {
    if (run.settled) return;
    run.settled = true;
    run.item.signal.removeEventListener("abort", run.onAbort);
    run.settle(outcomeOf(run));
  }

  /** Ends a run early: its sequences leave the scheduler and their blocks are released. */
  #stop(run: Run, state: "cancelled" | "error"): void {
    if (run.state !== "active") return;
    run.state = state;
    for (const choice of run.choices) {
      this.#bySeq.delete(choice.seq);
      this.#scheduler.cancel(choice.seq);
      if (!choice.finished)
        this.#metrics.success.inc({ model_name: run.head.model, finished_reason: "abort" });
    }
    this.#runs.delete(run);
    run.queue.length = 0;
    run.wake?.();
    // Freed blocks may let a blocked waiting sequence in.
    this.#wakeLoop?.();
  }

  #cancel(run: Run): void {
    this.#stop(run, "cancelled");
    this.#settle(run);
  }

  #fail(run: Run, error: OpenAIError): void {
    run.error = error;
    this.#stop(run, "error");
    this.#settle(run);
  }

  #finish(run: Run): void {
    const { head } = run;
    for (const bytes of finalChunks(run)) this.#push(run, bytes);
    run.state = "ok";
    this.#runs.delete(run);
    for (const choice of run.choices) this.#bySeq.delete(choice.seq);
    this.#metrics.e2e.observe(
      { model_name: head.model },
      (performance.now() - run.submittedAt) / 1000,
    );
    run.wake?.();
  }

  #deliver(step: NonNullable<ReturnType<Scheduler["step"]>>): void {
    const now = performance.now();
    for (const id of step.preempted) {
      const entry = this.#bySeq.get(id);
      if (entry !== undefined) this.#metrics.preemptions.inc({ model_name: entry.run.head.model });
    }
    const touched = new Set<Run>();
    for (const token of step.tokens) {
      const entry = this.#bySeq.get(token.seq);
      if (entry === undefined) continue;
      const { run, choice } = entry;
      const labels = { model_name: run.head.model };
      choice.produced = token.index + 1;
      this.#metrics.generationTokens.inc(labels);
      if (choice.lastTokenAt === null) {
        this.#metrics.promptTokens.inc(
          labels,
          run.request.prompts[choice.promptIndex]?.length ?? 0,
        );
      } else {
        this.#metrics.itl.observe(labels, (now - choice.lastTokenAt) / 1000);
      }
      choice.lastTokenAt = now;
      if (run.firstTokenAt === null) {
        run.firstTokenAt = now;
        this.#metrics.ttft.observe(labels, (now - run.submittedAt) / 1000);
      }
      touched.add(run);
    }
    for (const id of step.finished) {
      const entry = this.#bySeq.get(id);
      if (entry === undefined) continue;
      entry.choice.finished = true;
      const reason = entry.choice.plan.finishReason === "length" ? "length" : "stop";
      this.#metrics.success.inc({ model_name: entry.run.head.model, finished_reason: reason });
    }
    for (const run of touched) {
      try {
        releaseTokens(run, (bytes) => this.#push(run, bytes));
        if (run.choices.every((c) => c.finished)) this.#finish(run);
      } catch (error) {
        // One answer that cannot be written fails alone; thrown out of the step loop, it
        // would stop the engine and take the origin's process with it.
        console.error("simulated engine could not write an answer", error);
        this.#fail(run, ENGINE_FAILED);
      }
    }
  }

  #admitted(step: NonNullable<ReturnType<Scheduler["step"]>>, now: number): void {
    for (const admission of step.admitted) {
      const entry = this.#bySeq.get(admission.seq);
      if (entry === undefined) continue;
      const { run, choice } = entry;
      const labels = { model_name: run.head.model };
      this.#metrics.prefixQueries.inc(labels, admission.queriedTokens);
      this.#metrics.prefixHits.inc(labels, admission.cachedTokens);
      run.queuedMs ??= now - run.submittedAt;
      // The first choice of each prompt reports what the cache served for that prompt.
      if (admission.firstTime && choice.index % run.request.n === 0) {
        run.cached[choice.promptIndex] = admission.cachedTokens;
        const length = run.request.prompts[choice.promptIndex]?.length ?? 0;
        const whole = Math.floor(length / this.#cache.blockSize) * this.#cache.blockSize;
        run.cacheWritten[choice.promptIndex] = Math.max(0, whole - admission.cachedTokens);
      }
    }
  }

  async #run(): Promise<void> {
    let deadline = performance.now();
    while (!this.#closed) {
      if (!this.#scheduler.hasWork) {
        await new Promise<void>((resolve) => {
          this.#wakeLoop = resolve;
        });
        this.#wakeLoop = null;
        deadline = performance.now();
        continue;
      }
      const now = performance.now();
      let step;
      try {
        step = this.#scheduler.step(now);
      } catch (error) {
        console.error("simulated engine step failed", error);
        for (const run of this.#runs) this.#fail(run, ENGINE_FAILED);
        continue;
      }
      if (step === null) {
        // Nothing fits right now; wait for a submit or cancel to change that.
        await new Promise<void>((resolve) => {
          this.#wakeLoop = resolve;
        });
        this.#wakeLoop = null;
        continue;
      }
      this.#admitted(step, now);
      const stepMs = step.durationMs * this.options.timeScale;
      this.#stepMs += STEP_MS_WEIGHT * (stepMs - this.#stepMs);
      deadline = Math.max(deadline, now) + stepMs;
      const wait = deadline - performance.now();
      await new Promise<void>((resolve) => {
        this.#endSleep = resolve;
        if (this.options.timeScale > 0 && wait >= 1) {
          this.#sleepTimer = setTimeout(resolve, wait);
        } else {
          // Let I/O and other requests in between steps even when time is not simulated.
          setImmediate(resolve);
        }
      });
      this.#sleepTimer = null;
      this.#endSleep = null;
      if (this.#closed) break;
      this.#deliver(step);
    }
  }
}

/** Starts a simulated engine; its step loop runs until {@link Engine.close}. */
export function createSimEngine(options: SimEngineOptions = {}): SimEngine {
  return new SimEngineImpl(options);
}
