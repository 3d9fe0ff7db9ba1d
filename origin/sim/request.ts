/**
 * Parses and validates an OpenAI-compatible request body for the simulated engine, and
 * answers invalid ones the way OpenAI and vLLM do (status, type, param, code).
 */
import type { ItemPath } from "../../contracts/protocol.ts";
import {
  renderChatPrompt,
  type ChatMessage,
  type ContentPart,
  type RenderedToolCall,
  type ToolDefinition,
} from "./chat-template.ts";
import type { OutputMode } from "./generate.ts";
import { tokenize } from "./tokenizer.ts";

/** A model the engine serves. */
export interface SimModel {
  id: string;
  max_model_len: number;
}

/** The OpenAI error object. */
export interface OpenAIError {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

/** A validated request, rendered into prompt tokens. */
export interface SimRequest {
  kind: "chat" | "completion";
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
}

/** Result of {@link parseRequest}. */
export type ParseResult =
  | { ok: true; request: SimRequest }
  | { ok: false; status: number; error: OpenAIError };

/** OpenAI's default sampling temperature. */
const DEFAULT_TEMPERATURE = 1;

class InvalidRequest extends Error {
  readonly status: number;
  readonly param: string | null;
  readonly code: string | null;
  constructor(message: string, param: string | null, code: string | null = null, status = 400) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
  }
}

type Json = Record<string, unknown>;

function isRecord(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

function invalidType(param: string, expected: string, value: unknown): InvalidRequest {
  return new InvalidRequest(
    `Invalid type for '${param}': expected ${expected}, but got ${typeName(value)} instead.`,
    param,
    "invalid_type",
  );
}

function optionalNumber(
  body: Json,
  key: string,
  min: number,
  max: number,
  integer: boolean,
): number | undefined {
  const value = body[key];
  if (value === undefined || value === null) return undefined;
  if (
    typeof value !== "number" ||
    !Number.isFinite(value) ||
    (integer && !Number.isInteger(value))
  ) {
    throw invalidType(key, integer ? "an integer" : "a number", value);
  }
  if (value < min) {
    throw new InvalidRequest(
      `Invalid '${key}': expected a value >= ${min}, but got ${value} instead.`,
      key,
      value < 0 ? "integer_below_min_value" : "invalid_value",
    );
  }
  if (value > max) {
    throw new InvalidRequest(
      `Invalid '${key}': expected a value <= ${max}, but got ${value} instead.`,
      key,
      "invalid_value",
    );
  }
  return value;
}

function optionalBoolean(body: Json, key: string): boolean | undefined {
  const value = body[key];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "boolean") throw invalidType(key, "a boolean", value);
  return value;
}

function parseContent(value: unknown, param: string, allowNull: boolean): ChatMessage["content"] {
  if (typeof value === "string") return value;
  if (value === null || value === undefined) {
    if (allowNull) return null;
    throw new InvalidRequest(
      `Missing required parameter: '${param}'.`,
      param,
      "missing_required_parameter",
    );
  }
  if (!Array.isArray(value)) throw invalidType(param, "a string or an array", value);
  return value.map((part: unknown, i): ContentPart => {
    const at = `${param}[${i}]`;
    if (!isRecord(part)) throw invalidType(at, "an object", part);
    switch (part["type"]) {
      case "text":
      case "refusal": {
        const text = part["text"] ?? part["refusal"];
        if (typeof text !== "string") throw invalidType(`${at}.text`, "a string", text);
        return { type: "text", text };
      }
      case "image_url": {
        const image = part["image_url"];
        const url = isRecord(image) ? image["url"] : image;
        if (typeof url !== "string") throw invalidType(`${at}.image_url.url`, "a string", url);
        return { type: "image_url", url };
      }
      case "input_audio": {
        const audio = part["input_audio"];
        const data = isRecord(audio) ? audio["data"] : undefined;
        if (typeof data !== "string") throw invalidType(`${at}.input_audio.data`, "a string", data);
        return { type: "input_audio", data };
      }
      default:
        throw new InvalidRequest(
          `Invalid value: '${String(part["type"])}'. Supported values are: 'text', 'image_url', 'input_audio' and 'refusal'.`,
          `${at}.type`,
          "invalid_value",
        );
    }
  });
}

function parseToolCalls(value: unknown, param: string): RenderedToolCall[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw invalidType(param, "an array", value);
  return value.map((call: unknown, i): RenderedToolCall => {
    const at = `${param}[${i}]`;
    if (!isRecord(call)) throw invalidType(at, "an object", call);
    const fn = call["function"];
    if (!isRecord(fn) || typeof fn["name"] !== "string") {
      throw new InvalidRequest(
        `Missing required parameter: '${at}.function.name'.`,
        `${at}.function.name`,
        "missing_required_parameter",
      );
    }
    const args = fn["arguments"];
    return {
      id: typeof call["id"] === "string" ? call["id"] : "",
      name: fn["name"],
      arguments: typeof args === "string" ? args : JSON.stringify(args ?? {}),
    };
  });
}

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

function parseMessages(value: unknown): ChatMessage[] {
  if (value === undefined) {
    throw new InvalidRequest(
      "Missing required parameter: 'messages'.",
      "messages",
      "missing_required_parameter",
    );
  }
  if (!Array.isArray(value)) throw invalidType("messages", "an array", value);
  if (value.length === 0) {
    throw new InvalidRequest(
      "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
      "messages",
      "empty_array",
    );
  }
  return value.map((raw: unknown, i): ChatMessage => {
    const at = `messages[${i}]`;
    if (!isRecord(raw)) throw invalidType(at, "an object", raw);
    const role = raw["role"];
    if (typeof role !== "string" || !ROLES.has(role)) {
      throw new InvalidRequest(
        `Invalid value: '${String(role)}'. Supported values are: 'system', 'assistant', 'user', 'tool', and 'developer'.`,
        `${at}.role`,
        "invalid_value",
      );
    }
    switch (role) {
      case "assistant": {
        const toolCalls = parseToolCalls(raw["tool_calls"], `${at}.tool_calls`);
        return {
          role,
          content: parseContent(raw["content"], `${at}.content`, true),
          toolCalls,
        };
      }
      case "tool": {
        const id = raw["tool_call_id"];
        if (typeof id !== "string") {
          throw new InvalidRequest(
            `Missing required parameter: '${at}.tool_call_id'.`,
            `${at}.tool_call_id`,
            "missing_required_parameter",
          );
        }
        return {
          role,
          content: parseContent(raw["content"], `${at}.content`, false),
          toolCallId: id,
        };
      }
      case "system":
      case "developer":
      case "user":
        return { role, content: parseContent(raw["content"], `${at}.content`, false) };
      default:
        throw new InvalidRequest(`Invalid role '${role}'.`, `${at}.role`, "invalid_value");
    }
  });
}

function parseTools(value: unknown): ToolDefinition[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw invalidType("tools", "an array", value);
  return value.map((raw: unknown, i): ToolDefinition => {
    const at = `tools[${i}]`;
    if (!isRecord(raw)) throw invalidType(at, "an object", raw);
    const fn = raw["function"];
    if (!isRecord(fn)) {
      throw new InvalidRequest(
        `Missing required parameter: '${at}.function'.`,
        `${at}.function`,
        "missing_required_parameter",
      );
    }
    const name = fn["name"];
    if (typeof name !== "string" || !/^[a-zA-Z0-9_-]{1,64}$/.test(name)) {
      throw new InvalidRequest(
        `Invalid '${at}.function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.`,
        `${at}.function.name`,
        "invalid_value",
      );
    }
    const description = fn["description"];
    return {
      name,
      ...(typeof description === "string" ? { description } : {}),
      ...(fn["parameters"] === undefined ? {} : { parameters: fn["parameters"] }),
    };
  });
}

function parseStop(value: unknown): string[] {
  if (value === undefined || value === null) return [];
  if (typeof value === "string") return [value];
  if (Array.isArray(value) && value.every((s): s is string => typeof s === "string")) {
    if (value.length > 4) {
      throw new InvalidRequest(
        `Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length ${value.length} instead.`,
        "stop",
        "array_above_max_length",
      );
    }
    return value;
  }
  throw invalidType("stop", "a string or an array of strings", value);
}

function parseMode(body: Json, tools: ToolDefinition[]): OutputMode {
  const choice = body["tool_choice"];
  if (choice !== undefined && choice !== null && tools.length === 0) {
    throw new InvalidRequest(
      "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
      "tool_choice",
      null,
    );
  }
  const first = tools[0];
  if (choice === "required" && first !== undefined) {
    return { kind: "tool", name: first.name, parameters: first.parameters ?? null };
  }
  if (isRecord(choice)) {
    const fn = choice["function"];
    const name = isRecord(fn) ? fn["name"] : undefined;
    const tool = tools.find((t) => t.name === name);
    if (tool === undefined) {
      throw new InvalidRequest(
        `Tool choice '${String(name)}' does not match any of the provided tools.`,
        "tool_choice",
        "invalid_value",
      );
    }
    return { kind: "tool", name: tool.name, parameters: tool.parameters ?? null };
  }
  if (
    choice !== undefined &&
    choice !== null &&
    choice !== "auto" &&
    choice !== "none" &&
    choice !== "required"
  ) {
    throw new InvalidRequest(
      `Invalid value: ${JSON.stringify(choice)}. Supported values are: 'none', 'auto', and 'required'.`,
      "tool_choice",
      "invalid_value",
    );
  }

  const format = body["response_format"];
  if (format === undefined || format === null) return { kind: "text" };
  if (!isRecord(format)) throw invalidType("response_format", "an object", format);
  switch (format["type"]) {
    case "text":
      return { kind: "text" };
    case "json_object":
      return { kind: "json", schema: null };
    case "json_schema": {
      const spec = format["json_schema"];
      return { kind: "json", schema: isRecord(spec) ? (spec["schema"] ?? null) : null };
    }
    default:
      throw new InvalidRequest(
        `Invalid value: '${String(format["type"])}'. Supported values are: 'text', 'json_object', and 'json_schema'.`,
        "response_format.type",
        "invalid_value",
      );
  }
}

function isTokenList(value: unknown): value is number[] {
  return (
    Array.isArray(value) &&
    value.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0)
  );
}

function parsePrompts(value: unknown): number[][] {
  if (value === undefined) {
    throw new InvalidRequest(
      "Missing required parameter: 'prompt'.",
      "prompt",
      "missing_required_parameter",
    );
  }
  if (typeof value === "string") return [tokenize(value)];
  if (Array.isArray(value) && value.length > 0) {
    if (isTokenList(value)) return [value];
    if (value.every((p) => typeof p === "string")) return value.map((p: string) => tokenize(p));
    if (value.every(isTokenList)) return value.map((p: number[]) => [...p]);
  }
  throw invalidType("prompt", "a string, an array of strings or an array of token arrays", value);
}

function contextError(
  model: SimModel,
  promptTokens: number,
  maxTokens: number | undefined,
  param: string,
): InvalidRequest {
  const what = param === "messages" ? "messages" : "prompt";
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

  const kind = path === "/v1/chat/completions" ? "chat" : "completion";
  let prompts: number[][];
  let mode: OutputMode = { kind: "text" };
  if (kind === "chat") {
    const messages = parseMessages(body["messages"]);
    const tools = parseTools(body["tools"]);
    mode = parseMode(body, tools);
    // tool_choice "none" hides nothing from the template: tools still count as prompt.
    prompts = [renderChatPrompt(messages, tools)];
  } else {
    prompts = parsePrompts(body["prompt"]);
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
  const includeUsage = isRecord(streamOptions) && streamOptions["include_usage"] === true;

  const n = optionalNumber(body, "n", 1, 128, true) ?? 1;
  const temperature = optionalNumber(body, "temperature", 0, 2, false) ?? DEFAULT_TEMPERATURE;
  const topP = optionalNumber(body, "top_p", 0, 1, false) ?? 1;
  const seed =
    optionalNumber(body, "seed", Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, true) ?? null;
  const ignoreEos = optionalBoolean(body, "ignore_eos") ?? false;
  const stop = parseStop(body["stop"]);
  // vLLM prefers max_completion_tokens, the successor of the deprecated max_tokens.
  const maxParam =
    body["max_completion_tokens"] !== undefined && body["max_completion_tokens"] !== null
      ? "max_completion_tokens"
      : "max_tokens";
  const requested = optionalNumber(body, maxParam, 1, Number.MAX_SAFE_INTEGER, true);

  const param = kind === "chat" ? "messages" : "prompt";
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
