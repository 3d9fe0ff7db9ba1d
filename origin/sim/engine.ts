/**
 * The simulated inference engine: parses OpenAI requests, plans deterministic output,
 * and runs every sequence through the paged KV cache and the continuous-batching
 * scheduler, releasing each token when its simulated step ends.
 */
import type {
  Engine,
  EngineHealth,
  EngineItem,
  EngineModel,
  EngineOutcome,
  EngineResponse,
} from "../engine.ts";
import type { ItemUsage, LoadReport } from "../../contracts/protocol.ts";
import {
  chatChunk,
  chatCompletion,
  errorJson,
  jsonBody,
  sseEvent,
  SSE_DONE,
  textChunk,
  textCompletion,
  usageChunk,
  usageJson,
  type ChoiceResult,
  type ResponseHead,
} from "./format.ts";
import { planOutput, type OutputPlan } from "./generate.ts";
import { Hasher, hashHex } from "./hash.ts";
import { KvCache, type SeqId } from "./kv-cache.ts";
import { Histogram, Metric } from "./prometheus.ts";
import { parseRequest, type OpenAIError, type SimModel, type SimRequest } from "./request.ts";
import { DEFAULT_SIM_TIMING, Scheduler, type SimTiming } from "./scheduler.ts";

/** The step cost model, configurable through {@link SimEngineOptions.timing}. */
export type { SimTiming } from "./scheduler.ts";

/** Options of {@link createSimEngine}. */
export interface SimEngineOptions {
  /** Models served; requests for others get 404 `model_not_found`. */
  models?: { id: string; max_model_len: number }[];
  /** KV capacity in blocks (the simulated GPU memory). */
  kvBlocks?: number;
  /** Tokens per KV block. */
  blockSize?: number;
  /** Most sequences running at once. */
  maxNumSeqs?: number;
  /** Per-step token budget shared by prefill and decode (chunked prefill). */
  maxNumBatchedTokens?: number;
  /** 1 = realistic wall-clock timing, 0 = no delay (still yields between steps), 0.1 = 10x faster. */
  timeScale?: number;
  /** Engine-wide seed: same options give the same bytes for the same request. */
  seed?: number;
  /** `created` of responses: fixed epoch seconds, or the wall clock. */
  created?: number | "clock";
  /** Step cost model; missing fields take {@link DEFAULT_SIM_TIMING}. */
  timing?: Partial<SimTiming>;
}

/** {@link SimEngineOptions} with every default filled in. */
export interface ResolvedSimEngineOptions {
  models: SimModel[];
  kvBlocks: number;
  blockSize: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  timeScale: number;
  seed: number;
  created: number | "clock";
  timing: SimTiming;
}

/** The simulated engine: an {@link Engine} that also shows the options it runs with. */
export type SimEngine = Engine & { readonly options: ResolvedSimEngineOptions };

/** Models served when none are configured. */
export const DEFAULT_SIM_MODELS: readonly SimModel[] = [
  { id: "warmgate-sim-8b", max_model_len: 32768 },
  { id: "warmgate-sim-70b", max_model_len: 8192 },
];

/** 2026-01-01T00:00:00Z, the default fixed `created`. */
export const DEFAULT_CREATED = 1767225600;

// vLLM's bucket bounds, so dashboards built for vLLM read these unchanged.
const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
  160, 640, 2560,
];
const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
];
const E2E_BUCKETS = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];

/** Weight of the newest step in the reported mean step time. */
const STEP_MS_WEIGHT = 0.2;
const JSON_HEADERS = { "content-type": "application/json" };
const SSE_HEADERS = { "content-type": "text/event-stream", "cache-control": "no-cache" };

function positiveInteger(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new RangeError(`${name} must be a positive integer, got ${value}`);
  }
  return value;
}

/** Fills defaults and rejects impossible settings (a configuration bug, so it throws). */
export function resolveSimEngineOptions(options: SimEngineOptions = {}): ResolvedSimEngineOptions {
  const models = (options.models ?? DEFAULT_SIM_MODELS).map((m) => ({
    id: m.id,
    max_model_len: positiveInteger(`max_model_len of ${m.id}`, m.max_model_len),
  }));
  if (models.length === 0) throw new RangeError("the simulated engine needs at least one model");
  const timeScale = options.timeScale ?? 1;
  if (!Number.isFinite(timeScale) || timeScale < 0) {
    throw new RangeError(`timeScale must be a finite number >= 0, got ${timeScale}`);
  }
  const timing = { ...DEFAULT_SIM_TIMING, ...options.timing };
  for (const [key, value] of Object.entries(timing)) {
    if (!Number.isFinite(value) || value < 0) throw new RangeError(`timing.${key} must be >= 0`);
  }
  const created = options.created ?? DEFAULT_CREATED;
  if (created !== "clock" && !Number.isInteger(created)) {
    throw new RangeError(`created must be an integer or "clock", got ${created}`);
  }
  return {
    models,
    kvBlocks: positiveInteger("kvBlocks", options.kvBlocks ?? 8192),
    blockSize: positiveInteger("blockSize", options.blockSize ?? 16),
    maxNumSeqs: positiveInteger("maxNumSeqs", options.maxNumSeqs ?? 64),
    maxNumBatchedTokens: positiveInteger(
      "maxNumBatchedTokens",
      options.maxNumBatchedTokens ?? 2048,
    ),
    timeScale,
    seed: Math.trunc(options.seed ?? 0),
    created,
    timing,
  };
}

interface Choice {
  index: number;
  promptIndex: number;
  seq: SeqId;
  plan: OutputPlan;
  /** Tokens the scheduler has produced for this choice. */
  produced: number;
  finished: boolean;
  lastTokenAt: number | null;
}

interface Run {
  item: EngineItem;
  request: SimRequest;
  head: ResponseHead;
  choices: Choice[];
  /** Prompt tokens served from cache, per prompt (from its first choice's admission). */
  cached: number[];
  queue: Uint8Array[];
  wake: (() => void) | null;
  state: "active" | "ok" | "cancelled" | "error";
  error: OpenAIError | null;
  submittedAt: number;
  queuedMs: number | null;
  ttftMs: number | null;
  firstTokenAt: number | null;
  /** Release cursor: token `round` of choice `pos` goes out next (keeps n > 1 byte-stable). */
  round: number;
  pos: number;
  settle: (outcome: EngineOutcome) => void;
  settled: boolean;
  onAbort: () => void;
}

function requestHash(seed: number, request: SimRequest): { sampling: number; id: number } {
  const h = new Hasher(0x73696d)
    .int(seed >>> 0)
    .str(request.kind)
    .str(request.model.id);
  for (const prompt of request.prompts) h.ints(prompt);
  // Greedy decoding ignores the seed, as in a real engine.
  if (request.temperature > 0) h.str(String(request.seed ?? "none"));
  h.str(String(request.temperature)).str(String(request.topP)).str(JSON.stringify(request.mode));
  h.str(String(request.ignoreEos));
  const sampling = h.digest();
  const id = h.int(request.n).int(request.maxTokens).str(JSON.stringify(request.stop)).digest();
  return { sampling, id };
}

function errorResponse(status: number, error: OpenAIError): EngineResponse {
  const body = jsonBody(errorJson(error));
  return {
    status,
    headers: { ...JSON_HEADERS },
    body: (async function* () {
      yield body;
    })(),
    outcome: Promise.resolve({
      outcome: "error",
      usage: null,
      error: { message: error.message, type: error.type, code: error.code },
      queued_ms: 0,
      ttft_ms: null,
    }),
  };
}

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

  readonly #running = new Metric(
    "vllm:num_requests_running",
    "gauge",
    "Number of requests in model execution batches.",
  );
  readonly #waiting = new Metric(
    "vllm:num_requests_waiting",
    "gauge",
    "Number of requests waiting to be processed.",
  );
  readonly #kvUsage = new Metric(
    "vllm:kv_cache_usage_perc",
    "gauge",
    "KV-cache usage. 1 means 100 percent usage.",
  );
  readonly #prefixQueries = new Metric(
    "vllm:prefix_cache_queries_total",
    "counter",
    "Prefix cache queries, in terms of number of queried tokens.",
  );
  readonly #prefixHits = new Metric(
    "vllm:prefix_cache_hits_total",
    "counter",
    "Prefix cache hits, in terms of number of cached tokens.",
  );
  readonly #promptTokens = new Metric(
    "vllm:prompt_tokens_total",
    "counter",
    "Number of prefill tokens processed.",
  );
  readonly #generationTokens = new Metric(
    "vllm:generation_tokens_total",
    "counter",
    "Number of generation tokens processed.",
  );
  readonly #preemptions = new Metric(
    "vllm:num_preemptions_total",
    "counter",
    "Cumulative number of preemption from the engine.",
  );
  readonly #success = new Metric(
    "vllm:request_success_total",
    "counter",
    "Count of successfully processed requests.",
  );
  readonly #ttft = new Histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    TTFT_BUCKETS,
  );
  readonly #itl = new Histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    ITL_BUCKETS,
  );
  readonly #e2e = new Histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    E2E_BUCKETS,
  );

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
    for (const model of this.options.models) {
      const labels = { model_name: model.id };
      for (const metric of [
        this.#prefixQueries,
        this.#prefixHits,
        this.#promptTokens,
        this.#generationTokens,
        this.#preemptions,
      ]) {
        metric.inc(labels, 0);
      }
      for (const reason of ["stop", "length", "abort"])
        this.#success.inc({ ...labels, finished_reason: reason }, 0);
      for (const histogram of [this.#ttft, this.#itl, this.#e2e]) histogram.touch(labels);
    }
    this.#loop = this.#run();
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
      return errorResponse(503, {
        message: "The engine is shutting down.",
        type: "server_error",
        param: null,
        code: null,
      });
    }
    const parsed = parseRequest(item.path, item.body, this.options.models);
    if (!parsed.ok) return errorResponse(parsed.status, parsed.error);
    const request = parsed.request;
    const hashes = requestHash(this.options.seed, request);

    const choices: Choice[] = [];
    for (let p = 0; p < request.prompts.length; p++) {
      const prompt = request.prompts[p] ?? [];
      for (let i = 0; i < request.n; i++) {
        const seed = new Hasher(p)
          .int(hashes.sampling)
          .int(request.temperature === 0 ? 0 : i + 1)
          .digest();
        const plan = planOutput({
          seed,
          maxTokens: request.maxTokens,
          stop: request.stop,
          mode: request.mode,
          ignoreEos: request.ignoreEos,
        });
        const blocks = Math.ceil((prompt.length + plan.ids.length) / this.options.blockSize);
        if (blocks > this.options.kvBlocks) {
          return errorResponse(400, {
            message: `This request needs ${blocks} KV cache blocks (${prompt.length} prompt tokens and ${plan.ids.length} completion tokens) but the engine holds ${this.options.kvBlocks}. Please reduce the length of the ${request.kind === "chat" ? "messages" : "prompt"} or completion.`,
            type: "invalid_request_error",
            param: request.kind === "chat" ? "messages" : "prompt",
            code: "context_length_exceeded",
          });
        }
        choices.push({
          index: p * request.n + i,
          promptIndex: p,
          seq: `${++this.#seqCounter}`,
          plan,
          produced: 0,
          finished: false,
          lastTokenAt: null,
        });
      }
    }

    const prefix = request.kind === "chat" ? "chatcmpl-" : "cmpl-";
    const created =
      this.options.created === "clock" ? Math.floor(Date.now() / 1000) : this.options.created;
    const { promise: outcome, resolve: settle } = Promise.withResolvers<EngineOutcome>();
    const run: Run = {
      item,
      request,
      head: { id: prefix + hashHex(hashes.id, 32), created, model: request.model.id },
      choices,
      cached: request.prompts.map(() => 0),
      queue: [],
      wake: null,
      state: "active",
      error: null,
      submittedAt: performance.now(),
      queuedMs: null,
      ttftMs: null,
      firstTokenAt: null,
      round: 0,
      pos: 0,
      settle,
      settled: false,
      onAbort: () => this.#cancel(run),
    };

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
    for (const model of this.options.models) {
      const labels = { model_name: model.id };
      this.#running.set(labels, running.get(model.id) ?? 0);
      this.#waiting.set(labels, waiting.get(model.id) ?? 0);
      // One KV pool backs every model the engine serves.
      this.#kvUsage.set(labels, this.#cache.usage);
    }
    return [
      this.#running,
      this.#waiting,
      this.#kvUsage,
      this.#prefixQueries,
      this.#prefixHits,
      this.#promptTokens,
      this.#generationTokens,
      this.#preemptions,
      this.#success,
      this.#ttft,
      this.#itl,
      this.#e2e,
    ]
      .flatMap((metric) => metric.render())
      .join("\n");
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
      this.#fail(run, {
        message: "The engine shut down before the request finished.",
        type: "server_error",
        param: null,
        code: null,
      });
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

  #usage(run: Run): ItemUsage {
    const prompt = run.request.prompts.reduce((sum, p) => sum + p.length, 0);
    const completion = run.choices.reduce((sum, c) => sum + c.produced, 0);
    const cached = run.cached.reduce((sum, c) => sum + c, 0);
    return {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      cached_tokens: cached,
    };
  }

  #settle(run: Run): void {
    if (run.settled) return;
    run.settled = true;
    run.item.signal.removeEventListener("abort", run.onAbort);
    const outcome = run.state === "ok" ? "ok" : run.state === "error" ? "error" : "cancelled";
    const error =
      run.error ??
      (outcome === "cancelled"
        ? { message: "The request was cancelled.", type: "cancelled", code: null }
        : undefined);
    run.settle({
      outcome,
      usage: this.#usage(run),
      ...(outcome === "ok" || error === undefined
        ? {}
        : { error: { message: error.message, type: error.type, code: error.code } }),
      queued_ms: run.queuedMs ?? performance.now() - run.submittedAt,
      ttft_ms: run.ttftMs,
    });
  }

  /** Ends a run early: its sequences leave the scheduler and their blocks are released. */
  #stop(run: Run, state: "cancelled" | "error"): void {
    if (run.state !== "active") return;
    run.state = state;
    for (const choice of run.choices) {
      this.#bySeq.delete(choice.seq);
      this.#scheduler.cancel(choice.seq);
      if (!choice.finished)
        this.#success.inc({ model_name: run.head.model, finished_reason: "abort" });
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

  /** Sends every token whose turn has come: token r of choice i after token r of choices before i. */
  #release(run: Run): void {
    const { choices } = run;
    for (;;) {
      const choice = choices[run.pos];
      if (choice === undefined) {
        run.round++;
        run.pos = 0;
        if (choices.every((c) => c.plan.ids.length <= run.round)) return;
        continue;
      }
      if (choice.plan.ids.length <= run.round) {
        run.pos++;
        continue;
      }
      if (choice.produced <= run.round) return;
      if (run.request.stream) this.#streamToken(run, choice, run.round);
      run.pos++;
    }
  }

  #streamToken(run: Run, choice: Choice, index: number): void {
    const { head, request } = run;
    const plan = choice.plan;
    const last = index === plan.ids.length - 1;
    const finish = last ? plan.finishReason : null;
    const delta = plan.deltas[index] ?? "";
    if (request.kind === "completion") {
      if (delta !== "" || last)
        this.#push(
          run,
          sseEvent(textChunk(head, choice.index, delta, finish, request.includeUsage)),
        );
      return;
    }
    if (index === 0) {
      this.#push(
        run,
        sseEvent(
          chatChunk(
            head,
            choice.index,
            { role: "assistant", content: "" },
            null,
            request.includeUsage,
          ),
        ),
      );
    }
    const call = plan.toolCall;
    if (call !== null) {
      const toolDelta =
        index === 0
          ? {
              index: 0 as const,
              id: call.id,
              type: "function" as const,
              function: { name: call.name, arguments: "" as const },
            }
          : { index: 0 as const, function: { arguments: delta } };
      this.#push(
        run,
        sseEvent(
          chatChunk(head, choice.index, { tool_calls: [toolDelta] }, finish, request.includeUsage),
        ),
      );
      return;
    }
    if (delta !== "" || last) {
      this.#push(
        run,
        sseEvent(chatChunk(head, choice.index, { content: delta }, finish, request.includeUsage)),
      );
    }
  }

  #finish(run: Run): void {
    const { head, request } = run;
    const usage = this.#usage(run);
    const json = usageJson(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
    if (request.stream) {
      if (request.includeUsage) {
        this.#push(
          run,
          sseEvent(
            usageChunk(
              head,
              request.kind === "chat" ? "chat.completion.chunk" : "text_completion",
              json,
            ),
          ),
        );
      }
      this.#push(run, SSE_DONE);
    } else {
      const results: ChoiceResult[] = run.choices.map((c) => ({
        index: c.index,
        text: c.plan.text,
        finishReason: c.plan.finishReason,
        toolCall: c.plan.toolCall,
      }));
      this.#push(
        run,
        jsonBody(
          request.kind === "chat"
            ? chatCompletion(head, results, json)
            : textCompletion(head, results, json),
        ),
      );
    }
    run.state = "ok";
    this.#runs.delete(run);
    for (const choice of run.choices) this.#bySeq.delete(choice.seq);
    this.#e2e.observe({ model_name: head.model }, (performance.now() - run.submittedAt) / 1000);
    run.wake?.();
  }

  #deliver(step: NonNullable<ReturnType<Scheduler["step"]>>): void {
    const now = performance.now();
    for (const id of step.preempted) {
      const entry = this.#bySeq.get(id);
      if (entry !== undefined) this.#preemptions.inc({ model_name: entry.run.head.model });
    }
    const touched = new Set<Run>();
    for (const token of step.tokens) {
      const entry = this.#bySeq.get(token.seq);
      if (entry === undefined) continue;
      const { run, choice } = entry;
      const labels = { model_name: run.head.model };
      choice.produced = token.index + 1;
      this.#generationTokens.inc(labels);
      if (choice.lastTokenAt === null) {
        this.#promptTokens.inc(labels, run.request.prompts[choice.promptIndex]?.length ?? 0);
      } else {
        this.#itl.observe(labels, (now - choice.lastTokenAt) / 1000);
      }
      choice.lastTokenAt = now;
      if (run.firstTokenAt === null) {
        run.firstTokenAt = now;
        this.#ttft.observe(labels, (now - run.submittedAt) / 1000);
      }
      touched.add(run);
    }
    for (const id of step.finished) {
      const entry = this.#bySeq.get(id);
      if (entry === undefined) continue;
      entry.choice.finished = true;
      const reason = entry.choice.plan.finishReason === "length" ? "length" : "stop";
      this.#success.inc({ model_name: entry.run.head.model, finished_reason: reason });
    }
    for (const run of touched) {
      this.#release(run);
      if (run.choices.every((c) => c.finished)) this.#finish(run);
    }
  }

  #admitted(step: NonNullable<ReturnType<Scheduler["step"]>>, now: number): void {
    for (const admission of step.admitted) {
      const entry = this.#bySeq.get(admission.seq);
      if (entry === undefined) continue;
      const { run, choice } = entry;
      const labels = { model_name: run.head.model };
      this.#prefixQueries.inc(labels, admission.queriedTokens);
      this.#prefixHits.inc(labels, admission.cachedTokens);
      run.queuedMs ??= now - run.submittedAt;
      // The first choice of each prompt reports what the cache served for that prompt.
      if (admission.firstTime && choice.index % run.request.n === 0) {
        run.cached[choice.promptIndex] = admission.cachedTokens;
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
        for (const run of this.#runs) {
          this.#fail(run, {
            message: "The engine failed while running the request.",
            type: "server_error",
            param: null,
            code: null,
          });
        }
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
