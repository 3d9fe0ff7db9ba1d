/**
 * The Responses API's request as the simulated engine reads it (docs/configuration.md,
 * "The simulated engine"): `instructions` and `input` rendered through the chat template,
 * flat function tools, `tool_choice`, `text.format`, and the fields a stored response
 * would need refused by name, as vLLM does without a response store.
 */
import type { ChatMessage } from "./chat-template.ts";
import type { OutputMode } from "./generate.ts";
import {
  InvalidRequest,
  invalidType,
  isRecord,
  optionalNumber,
  parseMessages,
  parseTools,
} from "./request-fields.ts";
import { formatMode, toolMode } from "./tool-choice.ts";

/** What a Responses API request asks for, beyond the sampling fields. */
export interface ResponsesFields {
  messages: ChatMessage[];
  tools: ReturnType<typeof parseTools>;
  mode: OutputMode;
  /** Alternatives per token when `include` asks for output logprobs; null for none. */
  logprobs: number | null;
  /** Request fields the response object repeats (instructions, tools, text, …). */
  echoed: Record<string, unknown>;
}

const PART_TYPES: Record<string, string> = {
  input_text: "text",
  output_text: "text",
  refusal: "refusal",
  input_image: "image_url",
};

function chatPart(part: unknown, at: string): unknown {
  if (!isRecord(part)) throw invalidType(at, "an object", part);
  const type = PART_TYPES[String(part["type"])];
  if (type === undefined) {
    throw new InvalidRequest(
      `Invalid value: '${String(part["type"])}'. Supported values are: 'input_text', 'output_text', 'refusal' and 'input_image'.`,
      `${at}.type`,
      "invalid_value",
    );
  }
  if (type === "image_url")
    return { type, image_url: { url: part["image_url"] ?? part["file_id"] } };
  return { ...part, type };
}

/** The input items as chat messages, in order; tool calls and outputs as chat writes them. */
function chatMessages(input: unknown, instructions: unknown): unknown[] {
  const out: unknown[] = [];
  if (instructions !== undefined && instructions !== null) {
    if (typeof instructions !== "string")
      throw invalidType("instructions", "a string", instructions);
    out.push({ role: "system", content: instructions });
  }
  if (typeof input === "string") {
    out.push({ role: "user", content: input });
    return out;
  }
  if (!Array.isArray(input)) throw invalidType("input", "a string or an array", input);
  input.forEach((item: unknown, i) => {
    const at = `input[${i}]`;
    if (!isRecord(item)) throw invalidType(at, "an object", item);
    const type = item["type"] ?? "message";
    if (type === "message") {
      const content = item["content"];
      out.push({
        role: item["role"],
        content: Array.isArray(content)
          ? content.map((part: unknown, j) => chatPart(part, `${at}.content[${j}]`))
          : content,
      });
    } else if (type === "function_call") {
      out.push({
        role: "assistant",
        content: null,
        tool_calls: [
          { id: item["call_id"], function: { name: item["name"], arguments: item["arguments"] } },
        ],
      });
    } else if (type === "function_call_output") {
      const output = item["output"];
      out.push({
        role: "tool",
        tool_call_id: item["call_id"],
        content: typeof output === "string" ? output : JSON.stringify(output ?? ""),
      });
    } else if (type !== "reasoning") {
      throw new InvalidRequest(
        `The simulated engine cannot read input items of type ${JSON.stringify(type)}; it reads 'message', 'function_call', 'function_call_output' and 'reasoning'.`,
        `${at}.type`,
        "unsupported_value",
      );
    }
  });
  if (out.length === 0) {
    throw new InvalidRequest("Invalid 'input': empty array.", "input", "empty_array");
  }
  return out;
}

function refuseStored(body: Record<string, unknown>): void {
  for (const field of ["previous_response_id", "conversation"] as const) {
    const value = body[field];
    if (value !== undefined && value !== null) {
      throw new InvalidRequest(
        `'${field}' needs stored responses, which this engine does not keep; send the whole conversation in 'input' instead.`,
        field,
        "unsupported_parameter",
      );
    }
  }
  if (body["background"] === true) {
    throw new InvalidRequest(
      "'background' responses need stored responses, which this engine does not keep.",
      "background",
      "unsupported_parameter",
    );
  }
}

/** Reads the Responses API's own fields; sampling fields are read with the other routes'. */
export function parseResponsesFields(body: Record<string, unknown>): ResponsesFields {
  refuseStored(body);
  const raw = chatMessages(body["input"], body["instructions"]);
  let messages: ChatMessage[];
  try {
    messages = parseMessages(raw);
  } catch (error) {
    if (!(error instanceof InvalidRequest)) throw error;
    // A message's problem, named where the caller wrote it.
    const param = error.param?.replace(/^messages/, "input") ?? null;
    throw new InvalidRequest(error.message.replaceAll("messages[", "input["), param, error.code);
  }
  const tools = parseTools(body["tools"], true);
  const text = body["text"];
  if (text !== undefined && text !== null && !isRecord(text))
    throw invalidType("text", "an object", text);
  const mode =
    toolMode(body["tool_choice"], tools, messages, true) ??
    formatMode(isRecord(text) ? text["format"] : undefined, "text.format");
  const include = body["include"];
  const wantsLogprobs = Array.isArray(include) && include.includes("message.output_text.logprobs");
  const top = optionalNumber(body, "top_logprobs", 0, 20, true);
  return {
    messages,
    tools,
    mode,
    logprobs: wantsLogprobs || top !== undefined ? (top ?? 0) : null,
    echoed: {
      instructions: body["instructions"] ?? null,
      max_output_tokens: body["max_output_tokens"] ?? null,
      metadata: body["metadata"] ?? {},
      parallel_tool_calls: body["parallel_tool_calls"] ?? true,
      text: isRecord(text) ? { format: { type: "text" }, ...text } : { format: { type: "text" } },
      tool_choice: body["tool_choice"] ?? "auto",
      tools: body["tools"] ?? [],
      truncation: body["truncation"] ?? "disabled",
      user: body["user"] ?? null,
      reasoning: body["reasoning"] ?? { effort: null, summary: null },
    },
  };
}
