/**
 * Renders chat messages and tool definitions into prompt tokens, ChatML-style (as Qwen's
 * template does), so prompt_tokens counts everything a real template would include.
 * See docs/configuration.md, "The simulated engine".
 */
import { Hasher } from "./hash.ts";
import { VOCAB_SIZE, tokenize } from "./tokenizer.ts";

/** Special token ids, above the ordinary vocabulary. */
export const SPECIAL_TOKENS = {
  imStart: VOCAB_SIZE + 1,
  imEnd: VOCAB_SIZE + 2,
  visionStart: VOCAB_SIZE + 3,
  visionEnd: VOCAB_SIZE + 4,
  audioStart: VOCAB_SIZE + 5,
  audioEnd: VOCAB_SIZE + 6,
} as const;

/** Tokens an image costs between its vision markers (a fixed-size patch grid). */
export const IMAGE_TOKENS = 256;
/** Tokens an audio clip costs between its audio markers. */
export const AUDIO_TOKENS = 128;

/** The default system prompt the template adds when the conversation has none. */
export const DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant.";

/** One part of a multi-part message content. */
export type ContentPart =
  | { type: "text"; text: string }
  | { type: "image_url"; url: string }
  | { type: "input_audio"; data: string };

/** A tool call that an assistant message made. */
export interface RenderedToolCall {
  id: string;
  name: string;
  /** JSON text of the arguments, as the model wrote it. */
  arguments: string;
}

/** A validated chat message. */
export interface ChatMessage {
  role: "system" | "developer" | "user" | "assistant" | "tool";
  content: string | ContentPart[] | null;
  toolCalls?: RenderedToolCall[];
  toolCallId?: string;
}

/** A function tool offered to the model. */
export interface ToolDefinition {
  name: string;
  description?: string;
  parameters?: unknown;
}

class PromptBuilder {
  readonly tokens: number[] = [];
  text(value: string): this {
    for (const id of tokenize(value)) this.tokens.push(id);
    return this;
  }
  special(id: number): this {
    this.tokens.push(id);
    return this;
  }
  // Placeholder ids derived from the media, so different media never share KV blocks
  // (vLLM mixes a multimodal hash into its block hashes for the same reason).
  media(start: number, end: number, count: number, source: string): this {
    this.tokens.push(start);
    const seed = new Hasher(7).str(source).digest();
    for (let i = 0; i < count; i++) this.tokens.push(new Hasher(i).int(seed).digest() % VOCAB_SIZE);
    this.tokens.push(end);
    return this;
  }
}

function renderContent(builder: PromptBuilder, content: ChatMessage["content"]): void {
  if (content === null) return;
  if (typeof content === "string") {
    builder.text(content);
    return;
  }
  for (const part of content) {
    switch (part.type) {
      case "text":
        builder.text(part.text);
        break;
      case "image_url":
        builder.media(SPECIAL_TOKENS.visionStart, SPECIAL_TOKENS.visionEnd, IMAGE_TOKENS, part.url);
        break;
      case "input_audio":
        builder.media(SPECIAL_TOKENS.audioStart, SPECIAL_TOKENS.audioEnd, AUDIO_TOKENS, part.data);
        break;
    }
  }
}

function toolsBlock(tools: readonly ToolDefinition[]): string {
  const lines = tools.map((tool) =>
    JSON.stringify({
      type: "function",
      function: {
        name: tool.name,
        ...(tool.description === undefined ? {} : { description: tool.description }),
        ...(tool.parameters === undefined ? {} : { parameters: tool.parameters }),
      },
    }),
  );
  return (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
    lines.join("\n") +
    "\n</tools>\n\nFor each function call, return a json object with function name and " +
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n" +
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
  );
}

/**
 * Prompt tokens of a conversation, ending with the assistant generation prompt.
 * System and developer messages render alike; tool results go back as `<tool_response>`.
 */
export function renderChatPrompt(
  messages: readonly ChatMessage[],
  tools: readonly ToolDefinition[] = [],
): number[] {
  const b = new PromptBuilder();
  const { imStart, imEnd } = SPECIAL_TOKENS;
  const first = messages[0];
  const hasSystem = first !== undefined && (first.role === "system" || first.role === "developer");
  if (!hasSystem) {
    b.special(imStart).text(`system\n${DEFAULT_SYSTEM_PROMPT}`);
    if (tools.length > 0) b.text(toolsBlock(tools));
    b.special(imEnd).text("\n");
  }
  messages.forEach((message, index) => {
    switch (message.role) {
      case "system":
      case "developer":
        b.special(imStart).text("system\n");
        renderContent(b, message.content);
        if (index === 0 && tools.length > 0) b.text(toolsBlock(tools));
        break;
      case "user":
        b.special(imStart).text("user\n");
        renderContent(b, message.content);
        break;
      case "assistant":
        b.special(imStart).text("assistant\n");
        renderContent(b, message.content);
        for (const call of message.toolCalls ?? []) {
          b.text(
            `\n<tool_call>\n{"name": ${JSON.stringify(call.name)}, "arguments": ${call.arguments}}\n</tool_call>`,
          );
        }
        break;
      case "tool":
        b.special(imStart).text("user\n<tool_response>\n");
        renderContent(b, message.content);
        b.text("\n</tool_response>");
        break;
    }
    b.special(imEnd).text("\n");
  });
  b.special(imStart).text("assistant\n");
  return b.tokens;
}
