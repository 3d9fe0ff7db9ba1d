/**
 * OpenAI response shapes the simulated engine writes: `chat.completion`,
 * `chat.completion.chunk`, `text_completion`, usage and errors, and SSE framing.
 * See docs/configuration.md, "The simulated engine".
 */
import type { OpenAIError } from "./request.ts";

/** OpenAI's usage object, with the prompt-cache detail. */
export interface UsageJson {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

/** What every body of one response shares. */
export interface ResponseHead {
  id: string;
  created: number;
  model: string;
}

/** One finished choice. */
export interface ChoiceResult {
  index: number;
  text: string;
  finishReason: "stop" | "length" | "tool_calls";
  toolCall: { id: string; name: string; arguments: string } | null;
  /** The choice's `logprobs` object, or null when none were asked for. */
  logprobs: unknown;
}

const encoder = new TextEncoder();

/** Encodes one SSE event: `data: {json}\n\n`. */
export function sseEvent(value: unknown): Uint8Array {
  return encoder.encode(`data: ${JSON.stringify(value)}\n\n`);
}

/** The stream terminator OpenAI sends after the last chunk. */
export const SSE_DONE: Uint8Array = encoder.encode("data: [DONE]\n\n");

/** Encodes a JSON body. */
export function jsonBody(value: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(value));
}

/** Builds a usage object. */
export function usageJson(prompt: number, completion: number, cached: number): UsageJson {
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

/** `{"error": {...}}`, the body of every OpenAI error. */
export function errorJson(error: OpenAIError): { error: OpenAIError } {
  return { error };
}

/** A non-streaming `chat.completion`. */
export function chatCompletion(
  head: ResponseHead,
  choices: ChoiceResult[],
  usage: UsageJson,
): unknown {
  return wholeCompletion(head, "chat.completion", usage, choices, (c) => ({
    message:
      c.toolCall === null
        ? { role: "assistant", content: c.text, refusal: null }
        : {
            role: "assistant",
            content: null,
            refusal: null,
            tool_calls: [
              {
                id: c.toolCall.id,
                type: "function",
                function: { name: c.toolCall.name, arguments: c.toolCall.arguments },
              },
            ],
          },
  }));
}

/** A non-streaming `text_completion`. */
export function textCompletion(
  head: ResponseHead,
  choices: ChoiceResult[],
  usage: UsageJson,
): unknown {
  return wholeCompletion(head, "text_completion", usage, choices, (c) => ({ text: c.text }));
}

/** A whole answer of `object`: each choice's `content` between its index and its ending. */
function wholeCompletion(
  head: ResponseHead,
  object: string,
  usage: UsageJson,
  choices: ChoiceResult[],
  content: (choice: ChoiceResult) => object,
): unknown {
  return {
    id: head.id,
    object,
    created: head.created,
    model: head.model,
    choices: choices.map((c) => ({
      index: c.index,
      ...content(c),
      logprobs: c.logprobs,
      finish_reason: c.finishReason,
    })),
    usage,
  };
}

/** What a chat chunk's delta carries. */
export type ChatDelta =
  | { role: "assistant"; content: "" }
  | { content: string }
  | {
      tool_calls: [
        | { index: 0; id: string; type: "function"; function: { name: string; arguments: "" } }
        | { index: 0; function: { arguments: string } },
      ];
    };

/**
 * One `chat.completion.chunk`. With `include_usage`, every chunk carries `usage: null`
 * (OpenAI's documented shape), and only the final usage chunk a number.
 */
export function chatChunk(
  head: ResponseHead,
  index: number,
  delta: ChatDelta,
  finishReason: string | null,
  includeUsage: boolean,
  logprobs: unknown = null,
): unknown {
  const choice = { index, delta, logprobs, finish_reason: finishReason };
  return streamChunk(head, "chat.completion.chunk", choice, includeUsage);
}

/** One streamed `text_completion` chunk. */
export function textChunk(
  head: ResponseHead,
  index: number,
  text: string,
  finishReason: string | null,
  includeUsage: boolean,
  logprobs: unknown = null,
): unknown {
  const choice = { index, text, logprobs, finish_reason: finishReason };
  return streamChunk(head, "text_completion", choice, includeUsage);
}

/** A streamed chunk of `object` with one choice (`usage: null` with `include_usage`). */
function streamChunk(
  head: ResponseHead,
  object: string,
  choice: object,
  includeUsage: boolean,
): unknown {
  return {
    id: head.id,
    object,
    created: head.created,
    model: head.model,
    choices: [choice],
    ...(includeUsage ? { usage: null } : {}),
  };
}

/** The final chunk of a stream that asked for usage: no choices, just the usage. */
export function usageChunk(head: ResponseHead, object: string, usage: UsageJson): unknown {
  return {
    id: head.id,
    object,
    created: head.created,
    model: head.model,
    choices: [],
    usage,
  };
}
