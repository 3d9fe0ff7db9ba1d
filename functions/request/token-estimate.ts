/**
 * A cheap prompt-token estimate, without a tokenizer, that errs high for real BPE
 * tokenizers (Llama, Mistral, Qwen, cl100k/o200k): the edge uses it to refuse prompts that
 * cannot fit a model's window before calling any origin, and to reserve tokens for limits.
 * See docs/edge.md.
 */
import type { ChatCompletionRequest, ChatMessage, CompletionRequest } from "./openai-schemas.ts";
import type { EmbeddingsRequest, ResponsesRequest } from "./responses-schemas.ts";

/** Chat-template tokens around each message (Llama 3: `<|start_header_id|>role<|end_header_id|>\n\n … <|eot_id|>`). */
export const TOKENS_PER_MESSAGE = 5;
/** Begin-of-sequence plus the assistant header that primes the reply. */
export const TOKENS_PER_PROMPT = 4;
/** An image part: OpenAI bills a high-detail 512px tile at 765 tokens; vision models use fewer. */
export const TOKENS_PER_IMAGE = 765;

// Letters of one script in a run, digits, whitespace, or any single other code point.
// Sticky: matched at one position, where the scanner below meets text beyond ASCII.
const PIECE = /(\p{Script=Latin}+)|(\p{L}+)|(\p{N}+)|(\s+)|(.)/suy;

// ASCII characters by the piece they start: 1 Latin letter, 2 digit, 3 whitespace, 0 other.
const ASCII_CLASS = new Uint8Array(128);
for (let c = 0; c < 128; c++) {
  const ch = String.fromCharCode(c);
  ASCII_CLASS[c] = /[A-Za-z]/.test(ch) ? 1 : /[0-9]/.test(ch) ? 2 : /\s/.test(ch) ? 3 : 0;
}

/**
 * Estimated tokens in `text`, piece by piece: a Latin word one per 4 letters (BPE merges
 * common words whole and splits rare ones into pieces about that size) plus one per accented
 * letter; digits one each (Llama 2, Mistral and Qwen split numbers into digits); other
 * scripts one per character plus one per word; whitespace runs other than a single space one
 * per two characters; ASCII symbols one, other symbols two or three (byte-level fallbacks).
 *
 * One pass over the text: runs of ASCII are classed by a table, and only a piece that starts
 * beyond ASCII or runs into it is matched with the Unicode pattern (exactly as matching the
 * whole text piece by piece would; a regular expression over every character costs several
 * times more, and prompts run to hundreds of kilobytes).
 */
export function estimateTextTokens(text: string): number {
  let tokens = 0;
  const length = text.length;
  let i = 0;
  while (i < length) {
    const code = text.charCodeAt(i);
    if (code < 0x80) {
      const kind = ASCII_CLASS[code] as number;
      if (kind === 0) {
        tokens++;
        i++;
        continue;
      }
      // The run of its class, and `next`, the character that stopped it (if any): integer
      // arithmetic and no table read beyond ASCII, for this loop is what a long prompt costs.
      let end = i + 1;
      let next = 0;
      while (end < length) {
        next = text.charCodeAt(end);
        if (next >= 0x80 || ASCII_CLASS[next] !== kind) break;
        end++;
      }
      // A run that stops at a character beyond ASCII may go on through it (`café`, `1٣`).
      if (end === length || next < 0x80) {
        const run = end - i;
        if (kind === 1) tokens += (run + 3) >>> 2;
        else if (kind === 2) tokens += run;
        else if (run > 1 || code !== 0x20) tokens += (run + 1) >>> 1;
        i = end;
        continue;
      }
    }
    PIECE.lastIndex = i;
    const match = PIECE.exec(text);
    if (match === null) break;
    tokens += pieceTokens(match);
    i = PIECE.lastIndex;
  }
  return tokens;
}

function pieceTokens(match: RegExpExecArray): number {
  const [piece, latin, letters, digits, space] = match;
  if (latin !== undefined) return Math.ceil(latin.length / 4) + nonAscii(latin);
  if (letters !== undefined) return letters.length + 1;
  if (digits !== undefined) return digits.length;
  if (space !== undefined) return space === " " ? 0 : Math.ceil(space.length / 2);
  const code = piece.codePointAt(0) ?? 0;
  return code > 0xffff ? 3 : code > 0x7f ? 2 : 1;
}

function nonAscii(text: string): number {
  let count = 0;
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) > 0x7f) count++;
  return count;
}

function estimateContent(content: ChatMessage["content"]): number {
  if (content === null || content === undefined) return 0;
  if (typeof content === "string") return estimateTextTokens(content);
  let tokens = 0;
  for (const part of content) {
    switch (part.type) {
      case "text":
        tokens += estimateTextTokens(part.text);
        break;
      case "refusal":
        tokens += estimateTextTokens(part.refusal);
        break;
      case "image_url":
        tokens += TOKENS_PER_IMAGE;
        break;
      // Audio and files are base64; about one token per 64 encoded characters is a ceiling
      // for speech encoders (Whisper: 50 frames per second at 16 kB/s of base64 WAV).
      case "input_audio":
        tokens += Math.ceil(part.input_audio.data.length / 64);
        break;
      case "file":
        tokens += Math.ceil((part.file.file_data?.length ?? 0) / 4);
        break;
    }
  }
  return tokens;
}

function estimateMessage(message: ChatMessage): number {
  let tokens = TOKENS_PER_MESSAGE + estimateContent(message.content);
  if ("name" in message && typeof message.name === "string") {
    tokens += estimateTextTokens(message.name) + 1;
  }
  if (message.role === "assistant") {
    for (const call of message.tool_calls ?? []) {
      tokens += TOKENS_PER_MESSAGE;
      tokens +=
        call.type === "function"
          ? estimateTextTokens(call.function.name) + estimateTextTokens(call.function.arguments)
          : estimateTextTokens(call.custom.name) + estimateTextTokens(call.custom.input);
    }
    if (message.function_call) {
      tokens += estimateTextTokens(message.function_call.name);
      tokens += estimateTextTokens(message.function_call.arguments);
    }
  }
  return tokens;
}

/** Estimated prompt tokens of a chat request: messages, and tool definitions the template inlines. */
export function estimateChatPromptTokens(request: ChatCompletionRequest): number {
  let tokens = TOKENS_PER_PROMPT;
  for (const message of request.messages) tokens += estimateMessage(message);
  if (request.tools !== undefined && request.tools.length > 0) {
    tokens += estimateTextTokens(JSON.stringify(request.tools));
  }
  if (request.functions !== undefined && request.functions.length > 0) {
    tokens += estimateTextTokens(JSON.stringify(request.functions));
  }
  return tokens;
}

/**
 * Estimated prompt tokens of each prompt of a legacy completion (one, or a list, each run
 * as separate sequences); token-id prompts are counted exactly.
 */
export function estimateCompletionPrompts(request: CompletionRequest): number[] {
  return estimatePromptList(request.prompt);
}

/** A text, texts, token ids or token-id lists, each estimated (token ids counted exactly). */
function estimatePromptList(value: string | string[] | number[] | number[][]): number[] {
  if (typeof value === "string") return [1 + estimateTextTokens(value)];
  if (typeof value[0] === "number") return [value.length];
  return value.map((item) =>
    typeof item === "string" ? 1 + estimateTextTokens(item) : Array.isArray(item) ? item.length : 0,
  );
}

/** Estimated prompt tokens of a legacy completion's longest prompt: what must fit the window. */
export function estimateCompletionPromptTokens(request: CompletionRequest): number {
  return Math.max(0, ...estimateCompletionPrompts(request));
}

function estimateResponsesContent(content: unknown): number {
  if (typeof content === "string") return estimateTextTokens(content);
  if (!Array.isArray(content)) return 0;
  let tokens = 0;
  for (const part of content as { type?: unknown; text?: unknown }[]) {
    if (typeof part.text === "string") tokens += estimateTextTokens(part.text);
    else if (part.type === "input_image") tokens += TOKENS_PER_IMAGE;
    else tokens += estimateTextTokens(JSON.stringify(part));
  }
  return tokens;
}

/**
 * Estimated prompt tokens of a Responses API request: instructions, each input item (a
 * message's content, a tool call's arguments, a tool output), and the tools.
 */
export function estimateResponsesPromptTokens(request: ResponsesRequest): number {
  let tokens = TOKENS_PER_PROMPT;
  if (typeof request.instructions === "string") {
    tokens += TOKENS_PER_MESSAGE + estimateTextTokens(request.instructions);
  }
  const { input } = request;
  if (typeof input === "string") tokens += TOKENS_PER_MESSAGE + estimateTextTokens(input);
  else {
    for (const item of input) {
      tokens += TOKENS_PER_MESSAGE;
      if (item.content !== undefined) tokens += estimateResponsesContent(item.content);
      else {
        const { arguments: args, output, name } = item as Record<string, unknown>;
        for (const text of [name, args, output]) {
          if (typeof text === "string") tokens += estimateTextTokens(text);
          else if (text !== undefined) tokens += estimateTextTokens(JSON.stringify(text));
        }
      }
    }
  }
  if (request.tools !== undefined && request.tools.length > 0) {
    tokens += estimateTextTokens(JSON.stringify(request.tools));
  }
  return tokens;
}

/** Estimated tokens of each input of an embeddings request; token-id inputs exactly. */
export function estimateEmbeddingInputs(request: EmbeddingsRequest): number[] {
  return estimatePromptList(request.input);
}
