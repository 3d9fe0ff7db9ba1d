/**
 * Parses and validates an OpenAI-compatible request body for the simulated engine
 * (docs/configuration.md, "The simulated engine"), and answers invalid ones the way OpenAI
 * and vLLM do (status, type, param, code).
 */
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import { renderChatPrompt } from "./chat-template.ts";
import type { OutputMode } from "./generate.ts";
import {
  InvalidRequest,
  isRecord,
  invalidType,
  optionalNumber,
  optionalBoolean,
  parseMessages,
  parseTools,
  parseStop,
  parsePrompts,
  parseChatLogprobs,
  echoTexts,
} from "./request-fields.ts";
import { MAX_BODY_DEPTH, MAX_SEQUENCES, tooDeepAt } from "./request-limits.ts";
import { parseMode } from "./tool-choice.ts";
import { parseResponsesFields } from "./responses-request.ts";
import {
  DEFAULT_EMBEDDING_DIMENSIONS,
  type EmbeddingFields,
  parseEmbeddingFields,
} from "./embeddings.ts";

/** A model the engine serves. */
export interface SimModel {
  id: string;
  max_model_len: number;
  /** `embed`: an embedding model, which serves `/v1/embeddings` only. */
  kind?: "generate" | "embed";
  /** Vector size of an embedding model. */
  dimensions?: number;
}

/** The request kind each path carries. */
export type RequestKind = "chat" | "completion" | "responses" | "embedding";

const KINDS: Record<ItemPath, RequestKind> = {
  "/v1/chat/completions": "chat",
  "/v1/completions": "completion",
  "/v1/responses": "responses",
  "/v1/embeddings": "embedding",
};

const API_NAMES: Record<RequestKind, string> = {
  chat: "Chat Completions API",
  completion: "Completions API",
  responses: "Responses API",
  embedding: "Embeddings API",
};

/** The OpenAI error object. */
export interface OpenAIError {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

/** A validated request, rendered into prompt tokens. */
export interface SimRequest {
  kind: RequestKind;
  model: SimModel;
  /** One prompt for chat; one per prompt for completions given a list. */
  prompts: number[][];
  n: number;
  maxTokens: number;
  stream: boolean;
  includeUsage: boolean;
  stop: string[];
  seed: number | null;
  temperature: number;
  topP: number;
  ignoreEos: boolean;
  mode: OutputMode;
  /** Alternatives per token to report with log probabilities; null: no log probabilities. */
  logprobs: number | null;
  /** Completions' `echo`: the prompt's text (one per prompt) comes back before the answer. */
  echo: string[] | null;
  /** Request fields a Responses API answer repeats; null for other kinds. */
  responses: Record<string, unknown> | null;
  /** What an embeddings request asks for; null for other kinds. */
  embedding: EmbeddingFields | null;
}

/** Result of {@link parseRequest}. */
export type ParseResult =
  | { ok: true; request: SimRequest }
  | { ok: false; status: number; error: OpenAIError };

/** OpenAI's default sampling temperature. */
const DEFAULT_TEMPERATURE = 1;

function contextError(
  model: SimModel,
  promptTokens: number,
  maxTokens: number | undefined,
  param: string,
): InvalidRequest {
  const what = param;
  const message =
    maxTokens === undefined
      ? `This model's maximum context length is ${model.max_model_len} tokens. However, your request has ${promptTokens} input tokens. Please reduce the length of the ${what}.`
      : `This model's maximum context length is ${model.max_model_len} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the ${what}, ${maxTokens} in the completion). Please reduce the length of the ${what} or completion.`;
  return new InvalidRequest(message, param, "context_length_exceeded");
}

function parse(path: ItemPath, text: string, models: readonly SimModel[]): SimRequest {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new InvalidRequest(
      "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
      null,
    );
  }
  if (!isRecord(body)) throw invalidType("body", "an object", body);
  const deep = tooDeepAt(body);
  if (deep !== null) {
    throw new InvalidRequest(
      `Invalid '${deep}': nested too deeply. Expected at most ${MAX_BODY_DEPTH} levels of objects and arrays in the request body.`,
      deep,
      "nesting_above_max_depth",
    );
  }

  const modelId = body["model"];
  if (modelId === undefined || modelId === null) {
    throw new InvalidRequest("you must provide a model parameter", null);
  }
  if (typeof modelId !== "string") throw invalidType("model", "a string", modelId);
  const model = models.find((m) => m.id === modelId);
  if (model === undefined) {
    throw new InvalidRequest(
      `The model \`${modelId}\` does not exist.`,
      "model",
      "model_not_found",
      404,
    );
  }

  const kind = KINDS[path];
  if ((kind === "embedding") !== (model.kind === "embed")) {
    throw new InvalidRequest(
      `The model \`${model.id}\` does not support the ${API_NAMES[kind]}.`,
      "model",
      "model_not_supported",
    );
  }
  if (kind === "embedding") return embeddingRequest(model, body);
  let prompts: number[][];
  let mode: OutputMode = { kind: "text" };
  let logprobs: number | null;
  let echo: string[] | null = null;
  let responses: Record<string, unknown> | null = null;
  if (kind === "responses") {
    const fields = parseResponsesFields(body);
    prompts = [renderChatPrompt(fields.messages, fields.tools)];
    mode = fields.mode;
    logprobs = fields.logprobs;
    responses = fields.echoed;
  } else if (kind === "chat") {
    const messages = parseMessages(body["messages"]);
    const tools = parseTools(body["tools"]);
    mode = parseMode(body, tools, messages);
    // tool_choice "none" hides nothing from the template: tools still count as prompt.
    prompts = [renderChatPrompt(messages, tools)];
    logprobs = parseChatLogprobs(body);
  } else {
    const parsed = parsePrompts(body["prompt"]);
    prompts = parsed.map((p) => p.tokens);
    logprobs = optionalNumber(body, "logprobs", 0, 5, true) ?? null;
    if (optionalBoolean(body, "echo") === true) echo = echoTexts(parsed);
  }

  const stream = optionalBoolean(body, "stream") ?? false;
  const streamOptions = body["stream_options"];
  if (streamOptions !== undefined && streamOptions !== null) {
    if (!stream) {
      throw new InvalidRequest(
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        "stream_options",
        null,
      );
    }
    if (!isRecord(streamOptions)) throw invalidType("stream_options", "an object", streamOptions);
  }
  // A Responses stream always ends with the response and its usage.
  const includeUsage =
    kind !== "responses" && isRecord(streamOptions) && streamOptions["include_usage"] === true;

  const n = kind === "responses" ? 1 : (optionalNumber(body, "n", 1, 128, true) ?? 1);
  if (prompts.length * n > MAX_SEQUENCES) {
    throw new InvalidRequest(
      `Invalid 'n': ${prompts.length} prompts with n=${n} would start ${prompts.length * n} sequences; a request starts at most ${MAX_SEQUENCES}.`,
      "n",
      "invalid_value",
    );
  }
  const temperature = optionalNumber(body, "temperature", 0, 2, false) ?? DEFAULT_TEMPERATURE;
  const topP = optionalNumber(body, "top_p", 0, 1, false) ?? 1;
  const seed =
    optionalNumber(body, "seed", Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, true) ?? null;
  const ignoreEos = optionalBoolean(body, "ignore_eos") ?? false;
  const stop = kind === "responses" ? [] : parseStop(body["stop"]);
  // vLLM prefers max_completion_tokens, the successor of the deprecated max_tokens.
  const maxParam =
    kind === "responses"
      ? "max_output_tokens"
      : body["max_completion_tokens"] !== undefined && body["max_completion_tokens"] !== null
        ? "max_completion_tokens"
        : "max_tokens";
  const requested = optionalNumber(body, maxParam, 1, Number.MAX_SAFE_INTEGER, true);

  const param = kind === "chat" ? "messages" : kind === "responses" ? "input" : "prompt";
  const longest = Math.max(...prompts.map((p) => p.length));
  if (prompts.some((p) => p.length === 0) && kind === "completion") {
    throw new InvalidRequest("Prompt cannot be empty.", "prompt", "invalid_value");
  }
  if (longest >= model.max_model_len) throw contextError(model, longest, undefined, param);
  if (requested !== undefined && longest + requested > model.max_model_len) {
    throw contextError(model, longest, requested, param);
  }
  const maxTokens = requested ?? model.max_model_len - longest;

  return {
    kind,
    model,
    prompts,
    n,
    maxTokens,
    stream,
    includeUsage,
    stop,
    seed,
    temperature,
    topP,
    ignoreEos,
    mode,
    logprobs,
    echo,
    responses,
    embedding: null,
  };
}

function embeddingRequest(model: SimModel, body: Record<string, unknown>): SimRequest {
  const fields = parseEmbeddingFields(body, model.dimensions ?? DEFAULT_EMBEDDING_DIMENSIONS);
  const longest = Math.max(...fields.inputs.map((p) => p.length));
  if (longest > model.max_model_len) {
    throw new InvalidRequest(
      `This model's maximum context length is ${model.max_model_len} tokens. However, you requested ${longest} tokens in the input for embedding generation. Please reduce the length of the input.`,
      "input",
      "context_length_exceeded",
    );
  }
  // Pooling runs at the end of the prefill: one step, no generated token.
  return {
    kind: "embedding",
    model,
    prompts: fields.inputs,
    n: 1,
    maxTokens: 1,
    stream: false,
    includeUsage: false,
    stop: [],
    seed: 0,
    temperature: 0,
    topP: 1,
    ignoreEos: false,
    mode: { kind: "text" },
    logprobs: null,
    echo: null,
    responses: null,
    embedding: fields,
  };
}

/** Validates `body` for `path`; never throws for bad input. */
export function parseRequest(
  path: ItemPath,
  body: string,
  models: readonly SimModel[],
): ParseResult {
  try {
    return { ok: true, request: parse(path, body, models) };
  } catch (error) {
    if (!(error instanceof InvalidRequest)) throw error;
    return {
      ok: false,
      status: error.status,
      error: {
        message: error.message,
        type: "invalid_request_error",
        param: error.param,
        code: error.code,
      },
    };
  }
}
