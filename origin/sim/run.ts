/**
 * One request as the simulated engine runs it (docs/configuration.md, "The simulated
 * engine"): its choices and their planned output, and the bytes it answers with, released
 * token by token in a stable order as the scheduler produces them.
 */
import type { EngineOutcome, EngineResponse, EngineItem } from "../engine.ts";
import type { ItemUsage } from "../../contracts/protocol/schema.ts";
import { errorJson, jsonBody, type ResponseHead } from "./format.ts";
import { planOutput, type OutputPlan } from "./generate.ts";
import { Hasher, hashHex } from "./hash.ts";
import type { SeqId } from "./kv-cache.ts";
import type { ResolvedSimEngineOptions } from "./options.ts";
import type { OpenAIError, SimRequest } from "./request.ts";

export const JSON_HEADERS = { "content-type": "application/json" };
export const SSE_HEADERS = { "content-type": "text/event-stream", "cache-control": "no-cache" };

/** Hands a run's next bytes to its body. */
export type Push = (bytes: Uint8Array) => void;

export interface Choice {
  index: number;
  promptIndex: number;
  /** Seed of the choice's output (and of its log probabilities). */
  seed: number;
  seq: SeqId;
  plan: OutputPlan;
  /** Tokens the scheduler has produced for this choice. */
  produced: number;
  finished: boolean;
  lastTokenAt: number | null;
}

export interface Run {
  item: EngineItem;
  request: SimRequest;
  head: ResponseHead;
  choices: Choice[];
  /** Prompt tokens served from cache, per prompt (from its first choice's admission). */
  cached: number[];
  /**
   * Prompt tokens written to the prefix cache, per prompt: the prompt's full blocks the
   * cache did not hold (an engine caches whole blocks once they are computed).
   */
  cacheWritten: number[];
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
  /** Events a Responses API stream has sent (its `sequence_number`). */
  events: number;
  settle: (outcome: EngineOutcome) => void;
  settled: boolean;
  onAbort: () => void;
}

/** The hashes a request's output and id come from. */
export interface RequestHashes {
  sampling: number;
  id: number;
}

/**
 * A request's hashes. `nonce` (null for none) stands for the randomness of a request
 * without a seed: it changes the id always, and the output unless decoding is greedy.
 */
export function requestHash(
  seed: number,
  request: SimRequest,
  nonce: number | null = null,
): RequestHashes {
  const h = new Hasher(0x73696d)
    .int(seed >>> 0)
    .str(request.kind)
    .str(request.model.id);
  for (const prompt of request.prompts) h.ints(prompt);
  // Greedy decoding ignores the seed, as in a real engine.
  if (request.temperature > 0) h.str(String(request.seed ?? nonce ?? "none"));
  h.str(String(request.temperature)).str(String(request.topP)).str(JSON.stringify(request.mode));
  h.str(String(request.ignoreEos));
  const sampling = h.digest();
  h.int(request.n).int(request.maxTokens).str(JSON.stringify(request.stop));
  h.str(String(request.logprobs)).str(JSON.stringify(request.echo));
  const id = (nonce === null ? h : h.str(String(nonce))).digest();
  return { sampling, id };
}

export function errorResponse(status: number, error: OpenAIError): EngineResponse {
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

/** What a run has used so far. */
export function usageOf(run: Run): ItemUsage {
  const prompt = run.request.prompts.reduce((sum, p) => sum + p.length, 0);
  // An embedding's one step pools the prompt: it generates nothing.
  const completion =
    run.request.kind === "embedding" ? 0 : run.choices.reduce((sum, c) => sum + c.produced, 0);
  const cached = run.cached.reduce((sum, c) => sum + c, 0);
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    cached_tokens: cached,
  };
}

/**
 * The choices of a request, each with its planned output; an error answer when one of them
 * could never fit in the KV cache.
 */
export function planChoices(
  request: SimRequest,
  options: ResolvedSimEngineOptions,
  nextSeq: () => SeqId,
  hashes: RequestHashes,
): Choice[] | EngineResponse {
  const choices: Choice[] = [];
  for (let p = 0; p < request.prompts.length; p++) {
    const prompt = request.prompts[p] ?? [];
    for (let i = 0; i < request.n; i++) {
      const seed = new Hasher(p)
        .int(hashes.sampling)
        .int(request.temperature === 0 ? 0 : i + 1)
        .digest();
      const plan =
        request.kind === "embedding"
          ? POOLING_STEP
          : planOutput({
              seed,
              maxTokens: request.maxTokens,
              stop: request.stop,
              mode: request.mode,
              ignoreEos: request.ignoreEos,
            });
      const blocks = Math.ceil((prompt.length + plan.ids.length) / options.blockSize);
      if (blocks > options.kvBlocks) {
        return errorResponse(400, {
          message: `This request needs ${blocks} KV cache blocks (${prompt.length} prompt tokens and ${plan.ids.length} completion tokens) but the engine holds ${options.kvBlocks}. Please reduce the length of the ${PROMPT_PARAMS[request.kind]} or completion.`,
          type: "invalid_request_error",
          param: PROMPT_PARAMS[request.kind],
          code: "context_length_exceeded",
        });
      }
      choices.push({
        index: p * request.n + i,
        promptIndex: p,
        seed,
        seq: nextSeq(),
        plan,
        produced: 0,
        finished: false,
        lastTokenAt: null,
      });
    }
  }
  return choices;
}

/** How a run that stopped ended, with what it used. */
export function outcomeOf(run: Run): EngineOutcome {
  const outcome = run.state === "ok" ? "ok" : run.state === "error" ? "error" : "cancelled";
  const error =
    run.error ??
    (outcome === "cancelled"
      ? { message: "The request was cancelled.", type: "cancelled", code: null }
      : undefined);
  return {
    outcome,
    usage: usageOf(run),
    ...(outcome === "ok" || error === undefined
      ? {}
      : { error: { message: error.message, type: error.type, code: error.code } }),
    queued_ms: run.queuedMs ?? performance.now() - run.submittedAt,
    ttft_ms: run.ttftMs,
  };
}

/** An embedding's one scheduler step, which shows nothing. */
const POOLING_STEP: OutputPlan = {
  ids: [0],
  deltas: [""],
  text: "",
  finishReason: "stop",
  toolCall: null,
};

/** The field that holds a request's prompt. */
const PROMPT_PARAMS: Record<SimRequest["kind"], string> = {
  chat: "messages",
  completion: "prompt",
  responses: "input",
  embedding: "input",
};

const ID_PREFIXES: Record<SimRequest["kind"], string> = {
  chat: "chatcmpl-",
  completion: "cmpl-",
  responses: "resp_",
  embedding: "embd-",
};

/** A run as submitted, before the scheduler has it. */
export function newRun(
  item: EngineItem,
  request: SimRequest,
  choices: Choice[],
  options: ResolvedSimEngineOptions,
  settle: (outcome: EngineOutcome) => void,
  hashes: RequestHashes,
): Run {
  const prefix = ID_PREFIXES[request.kind];
  const created = options.created === "clock" ? Math.floor(Date.now() / 1000) : options.created;
  return {
    item,
    request,
    head: { id: prefix + hashHex(hashes.id, 32), created, model: request.model.id },
    choices,
    cached: request.prompts.map(() => 0),
    cacheWritten: request.prompts.map(() => 0),
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
    events: 0,
    settle,
    settled: false,
    onAbort: () => {},
  };
}
