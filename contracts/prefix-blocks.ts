/**
 * Prefix blocks of a prompt as the edge sees them (docs/routing.md): the request rendered
 * to text (chat messages with their roles, or the completion prompt), cut into a token
 * stand-in of `BYTES_PER_TOKEN` UTF-8 bytes, grouped into blocks of `BLOCK_TOKENS` tokens and
 * chain-hashed per model, as vLLM and llm-d chain their KV blocks: two prompts share their
 * first n block hashes exactly when their renderings share the first n blocks' bytes.
 */

/** UTF-8 bytes per stand-in token: about what a BPE token covers in English text. */
export const BYTES_PER_TOKEN = 4;
/** Stand-in tokens per block (vLLM's default block size). */
export const BLOCK_TOKENS = 16;
/** Leading prefix blocks (64 tokens) whose hash keys a cold prefix and a request's shard. */
export const COLD_KEY_BLOCKS = 4;
/** Most prefix blocks hashed per request (131,072 tokens); later ones never route. */
export const MAX_ROUTE_BLOCKS = 8_192;

/**
 * The key of a prompt's leading prefix (the hash of its first {@link COLD_KEY_BLOCKS}
 * blocks, or of all when fewer): it names a request's shard and groups a batch's lines;
 * null for a prompt shorter than one block.
 */
export function prefixKey(blocks: readonly number[]): number | null {
  return blocks.length === 0
    ? null
    : (blocks[Math.min(blocks.length, COLD_KEY_BLOCKS) - 1] ?? null);
}

/**
 * A key's shard among `count`: the key modulo the count. Counts only double and halve
 * (docs/batching.md, "Shards"), so a split moves half of each shard's keys to one new
 * shard and a merge moves them back; the rest stay where their index is.
 */
export function shardOfKey(key: number, count: number): number {
  return (key >>> 0) % count;
}

/** A chat message as far as rendering goes. */
export interface RenderedMessage {
  role: string;
  content: unknown;
}

/** A request as far as its prefix goes: chat messages, a completion's prompt, or a response's input. */
export type PrefixRequest =
  | { messages: readonly RenderedMessage[] }
  | { prompt: unknown }
  | { input: unknown; instructions?: unknown };

/**
 * A Responses API request's `instructions` and `input` as chat messages: instructions as a
 * system message, a string input as a user message, message items as they are, and tool
 * calls and their outputs as messages of their type with their arguments or output.
 */
export function responsesMessages(request: { input?: unknown; instructions?: unknown }) {
  const messages: RenderedMessage[] = [];
  const { input, instructions } = request;
  if (typeof instructions === "string") messages.push({ role: "system", content: instructions });
  if (typeof input === "string") messages.push({ role: "user", content: input });
  else if (Array.isArray(input)) {
    for (const item of input as Record<string, unknown>[]) {
      if (typeof item !== "object" || item === null) continue;
      if (typeof item.role === "string") {
        // Parts as chat writes them: `input_text` and `output_text` are text parts.
        const content = Array.isArray(item.content)
          ? (item.content as { type?: unknown; text?: unknown }[]).map((part) =>
              typeof part?.text === "string" ? { type: "text", text: part.text } : part,
            )
          : item.content;
        messages.push({ role: item.role, content });
      } else if (typeof item.type === "string") {
        const content = item.arguments ?? item.output ?? "";
        messages.push({ role: item.type, content: typeof content === "string" ? content : "" });
      }
    }
  }
  return messages;
}

/**
 * The text a prompt's prefix cache follows: each chat message as `<|role|>` and its text
 * (text parts joined, other parts by their type), or a completion's prompt as it is.
 */
export function renderPrompt(request: PrefixRequest): string {
  let text = "";
  forEachPiece(request, (piece) => {
    text += piece;
  });
  return text;
}

/** The block hashes of a request's rendering (see {@link renderPrompt}), at most `maxBlocks`. */
export function promptBlocks(model: string, request: PrefixRequest, maxBlocks = Infinity) {
  const hasher = new BlockHasher(model, maxBlocks);
  // Piece by piece: the rendering is never built as one string.
  forEachPiece(request, (piece) => hasher.feed(piece));
  return hasher.hashes;
}

/**
 * The chain hashes of a text's whole blocks for `model`, at most `maxBlocks`: block i's
 * hash covers the model and every byte of blocks 0..i (a 32-bit Murmur-style mix over
 * 4-byte words, chained). A trailing partial block has no hash, as an engine caches only
 * full blocks.
 */
export function blockHashes(model: string, text: string, maxBlocks = Infinity): number[] {
  const hasher = new BlockHasher(model, maxBlocks);
  hasher.feed(text);
  return hasher.hashes;
}

/** Stand-in tokens the first `blocks` blocks cover. */
export function blockTokens(blocks: number): number {
  return blocks * BLOCK_TOKENS;
}

function forEachPiece(request: PrefixRequest, piece: (text: string) => void): void {
  if ("messages" in request || "input" in request) {
    const messages = "messages" in request ? request.messages : responsesMessages(request);
    for (const message of messages) {
      piece(`<|${message.role}|>\n`);
      const { content } = message;
      if (typeof content === "string") piece(content);
      else if (Array.isArray(content)) {
        for (const part of content as { type?: unknown; text?: unknown }[]) {
          piece(typeof part.text === "string" ? part.text : `<${String(part.type)}>`);
        }
      }
      piece("\n");
    }
    return;
  }
  const { prompt } = request;
  // A list of prompts: the first one routes the request.
  const first: unknown =
    Array.isArray(prompt) && !prompt.every((p) => typeof p === "number") ? prompt[0] : prompt;
  if (typeof first === "string") piece(first);
  else if (Array.isArray(first)) piece(first.join(","));
}

const encoder = new TextEncoder();
// Reused between calls: a prompt's bytes need no allocation of their own.
let scratch = new Uint8Array(64 * 1024);
let view = new DataView(scratch.buffer);

/** Chain-hashes text fed piece by piece, as if it were one string. */
class BlockHasher {
  readonly hashes: number[] = [];
  readonly #max: number;
  #hash = 0x811c9dc5;
  #inBlock = 0;
  #carry = 0;
  #carried = 0;

  constructor(model: string, max: number) {
    this.#max = max;
    for (let i = 0; i < model.length; i++) {
      this.#hash = Math.imul(this.#hash ^ model.charCodeAt(i), 0x01000193);
    }
  }

  feed(text: string): void {
    if (this.hashes.length >= this.#max || text.length === 0) return;
    // A UTF-8 encoding takes at most three bytes per UTF-16 unit.
    if (scratch.byteLength < text.length * 3) {
      scratch = new Uint8Array(text.length * 3);
      view = new DataView(scratch.buffer);
    }
    const bytes = scratch;
    const words = view;
    const { written } = encoder.encodeInto(text, bytes);
    let i = 0;
    while (this.#carried > 0 && i < written) {
      this.#carry |= (bytes[i++] ?? 0) << (8 * this.#carried);
      if (++this.#carried === 4) {
        this.#mix(this.#carry);
        this.#carry = 0;
        this.#carried = 0;
      }
    }
    // The hot loop on locals: one mix per word, a hash per block.
    let hash = this.#hash;
    let inBlock = this.#inBlock;
    const { hashes } = this;
    const max = this.#max;
    for (; i + 4 <= written && hashes.length < max; i += 4) {
      hash ^= Math.imul(words.getInt32(i, true), 0xcc9e2d51);
      hash = (Math.imul((hash << 13) | (hash >>> 19), 5) + 0xe6546b64) | 0;
      if (++inBlock === BLOCK_TOKENS) {
        inBlock = 0;
        hashes.push(hash >>> 0);
      }
    }
    this.#hash = hash;
    this.#inBlock = inBlock;
    for (; i < written; i++) this.#carry |= (bytes[i] ?? 0) << (8 * this.#carried++);
  }

  #mix(word: number): void {
    let hash = this.#hash ^ Math.imul(word, 0xcc9e2d51);
    hash = (Math.imul((hash << 13) | (hash >>> 19), 5) + 0xe6546b64) | 0;
    this.#hash = hash;
    if (++this.#inBlock < BLOCK_TOKENS) return;
    this.#inBlock = 0;
    if (this.hashes.length < this.#max) this.hashes.push(hash >>> 0);
  }
}
