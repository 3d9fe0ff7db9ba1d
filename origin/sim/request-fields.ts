/**
 * The fields of an OpenAI request body as the simulated engine reads them (docs/
 * configuration.md, "The simulated engine"): messages, tools, stop sequences, the output
 * mode, prompts, and the OpenAI-shaped error for a field that is wrong.
 */
import {
  type ChatMessage,
  type ContentPart,
  type RenderedToolCall,
  type ToolDefinition,
} from "./chat-template.ts";
import { MAX_SEQUENCES, MAX_TOOLS } from "./request-limits.ts";
import { tokenize } from "./tokenizer.ts";

export class InvalidRequest extends Error {
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

export function isRecord(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

export function invalidType(param: string, expected: string, value: unknown): InvalidRequest {
  return new InvalidRequest(
    `Invalid type for '${param}': expected ${expected}, but got ${typeName(value)} instead.`,
    param,
    "invalid_type",
  );
}

/** OpenAI's answer to a list longer than a field takes. */
export function arrayTooLong(param: string, max: number, length: number): InvalidRequest {
  return new InvalidRequest(
    `Invalid '${param}': array too long. Expected an array with maximum length ${max}, but got an array with length ${length} instead.`,
    param,
    "array_above_max_length",
  );
}

export function optionalNumber(
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

export function optionalBoolean(body: Json, key: string): boolean | undefined {
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

export function parseMessages(value: unknown): ChatMessage[] {
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

/**
 * Function tools: chat's `{type, function: {name, …}}`, or with `flat` the Responses API's
 * `{type, name, …}`. Other tool types are refused by name.
 */
export function parseTools(value: unknown, flat = false): ToolDefinition[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw invalidType("tools", "an array", value);
  if (value.length > MAX_TOOLS) throw arrayTooLong("tools", MAX_TOOLS, value.length);
  return value.map((raw: unknown, i): ToolDefinition => {
    const at = `tools[${i}]`;
    if (!isRecord(raw)) throw invalidType(at, "an object", raw);
    const type = raw["type"] ?? "function";
    if (type !== "function") {
      throw new InvalidRequest(
        `The simulated engine supports function tools only; ${at}.type is ${JSON.stringify(type)}.`,
        `${at}.type`,
        "unsupported_value",
      );
    }
    const fn = flat ? raw : raw["function"];
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
        `Invalid '${at}${flat ? "" : ".function"}.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.`,
        `${at}${flat ? "" : ".function"}.name`,
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

export function parseStop(value: unknown): string[] {
  if (value === undefined || value === null) return [];
  if (typeof value === "string") return [value];
  if (Array.isArray(value) && value.every((s): s is string => typeof s === "string")) {
    if (value.length > 4) throw arrayTooLong("stop", 4, value.length);
    return value;
  }
  throw invalidType("stop", "a string or an array of strings", value);
}

function isTokenList(value: unknown): value is number[] {
  return (
    Array.isArray(value) &&
    value.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0)
  );
}

/** One completions prompt: its tokens, and its text when it was given as text. */
export interface PromptInput {
  tokens: number[];
  text: string | null;
}

export function parsePrompts(value: unknown): PromptInput[] {
  if (value === undefined) {
    throw new InvalidRequest(
      "Missing required parameter: 'prompt'.",
      "prompt",
      "missing_required_parameter",
    );
  }
  if (typeof value === "string") return [{ tokens: tokenize(value), text: value }];
  if (Array.isArray(value) && value.length > 0) {
    if (isTokenList(value)) return [{ tokens: value, text: null }];
    if (value.length > MAX_SEQUENCES) throw arrayTooLong("prompt", MAX_SEQUENCES, value.length);
    if (value.every((p) => typeof p === "string")) {
      return value.map((p: string) => ({ tokens: tokenize(p), text: p }));
    }
    if (value.every(isTokenList))
      return value.map((p: number[]) => ({ tokens: [...p], text: null }));
  }
  throw invalidType("prompt", "a string, an array of strings or an array of token arrays", value);
}

/** The prompts' texts for `echo`; token prompts have none the simulated engine could show. */
export function echoTexts(prompts: PromptInput[]): string[] {
  return prompts.map((p) => {
    if (p.text === null) {
      throw new InvalidRequest(
        "The simulated engine cannot echo a prompt given as token ids (it has no vocabulary to decode them); send the prompt as text, or leave 'echo' unset.",
        "echo",
        "unsupported_value",
      );
    }
    return p.text;
  });
}

/** Chat's `logprobs` and `top_logprobs`: how many alternatives to report, or null for none. */
export function parseChatLogprobs(body: Json): number | null {
  const on = optionalBoolean(body, "logprobs") ?? false;
  const top = optionalNumber(body, "top_logprobs", 0, 20, true);
  if (top !== undefined && !on) {
    throw new InvalidRequest(
      "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.",
      "top_logprobs",
      "invalid_value",
    );
  }
  return on ? (top ?? 0) : null;
}
