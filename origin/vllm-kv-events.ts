/**
 * vLLM's KV-cache events as block events of the items this origin forwards (docs/routing.md,
 * "Block events"): a ZMQ SUB socket on the engine's publisher (`--kv-events-config`'s
 * endpoint; multipart topic, 8-byte sequence, msgpack `[ts, events, dp_rank]` with tagged
 * `BlockStored`, `BlockRemoved` and `AllBlocksCleared`), a mirror of its blocks keyed by
 * parent and tokens, and each forwarded prompt tokenized by the engine (`POST /tokenize`)
 * and matched block by block to the hashes the engine stored for it.
 */
import { decode } from "@msgpack/msgpack";
import { Subscriber } from "zeromq";
import type { EngineBlockEvent } from "./engine.ts";
import { responsesMessages } from "../contracts/prefix-blocks.ts";

/** How long a forwarded prompt waits for its blocks' events. */
const MATCH_WINDOW_MS = 30_000;
/** Most blocks the mirror keeps (a bound on memory; vLLM's own pool is smaller). */
const MAX_MIRRORED = 1_000_000;

/** Where the engine's events come from, and how to tokenize a forwarded prompt. */
export interface VllmKvEventsOptions {
  /** The publisher's endpoint, e.g. `tcp://127.0.0.1:5557`. */
  endpoint: string;
  /** Topic to subscribe to (vLLM's default: every topic). */
  topic?: string;
  /** The prompt tokens of a forwarded body, as the engine tokenizes them; null if unknown. */
  tokenize(path: string, body: string): Promise<number[] | null>;
}

interface Pending {
  tokens: number[];
  /** Leading blocks matched so far. */
  matched: number;
  parent: string | null;
  until: number;
}

/** Follows one engine's KV-cache events for the items forwarded to it. */
export class VllmKvEvents {
  readonly #socket = new Subscriber();
  readonly #options: VllmKvEventsOptions;
  // `${parent}|${tokens}` -> block hash, and back.
  readonly #byContent = new Map<string, string>();
  readonly #content = new Map<string, string>();
  readonly #pending = new Map<string, Pending>();
  #blockSize = 16;
  #listener: ((event: EngineBlockEvent) => void) | null = null;
  /** Sequence number of the last message read (gaps mean events were lost). */
  lastSeq: bigint | null = null;

  constructor(options: VllmKvEventsOptions) {
    this.#options = options;
    this.#socket.connect(options.endpoint);
    this.#socket.subscribe(options.topic ?? "");
    void this.#read();
  }

  onBlocks(listener: (event: EngineBlockEvent) => void): void {
    this.#listener = listener;
  }

  /** A forwarded item: its prompt is tokenized, then matched as its blocks' events come. */
  track(item: string, path: string, body: string): void {
    void this.#options
      .tokenize(path, body)
      .then((tokens) => {
        if (tokens === null) return;
        this.#pending.set(item, {
          tokens,
          matched: 0,
          parent: null,
          until: Date.now() + MATCH_WINDOW_MS,
        });
        this.#match();
      })
      .catch(() => {});
  }

  close(): void {
    this.#socket.close();
  }

  async #read(): Promise<void> {
    try {
      for await (const frames of this.#socket) {
        const [, seq, payload] = frames;
        if (seq !== undefined && seq.length === 8) this.lastSeq = seq.readBigUInt64BE(0);
        if (payload !== undefined) this.#apply(payload);
      }
    } catch {
      // Closed.
    }
  }

  #apply(payload: Buffer): void {
    let batch: unknown;
    try {
      batch = decode(payload);
    } catch {
      return;
    }
    if (!Array.isArray(batch) || !Array.isArray(batch[1])) return;
    for (const event of batch[1] as unknown[]) {
      if (!Array.isArray(event)) continue;
      switch (event[0]) {
        case "BlockStored":
          this.#stored(event);
          break;
        case "BlockRemoved": {
          const hashes = (Array.isArray(event[1]) ? event[1] : []).map(hashKey);
          for (const hash of hashes) {
            const content = this.#content.get(hash);
            this.#content.delete(hash);
            if (content !== undefined) this.#byContent.delete(content);
          }
          this.#listener?.({ kind: "removed", hashes });
          break;
        }
        case "AllBlocksCleared":
          this.#content.clear();
          this.#byContent.clear();
          this.#listener?.({ kind: "cleared" });
          break;
      }
    }
    this.#match();
  }

  // ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
  #stored(event: unknown[]): void {
    const hashes = Array.isArray(event[1]) ? event[1].map(hashKey) : [];
    const tokens = Array.isArray(event[3]) ? (event[3] as number[]) : [];
    const size = typeof event[4] === "number" && event[4] > 0 ? event[4] : this.#blockSize;
    this.#blockSize = size;
    let parent = event[2] === null || event[2] === undefined ? null : hashKey(event[2]);
    for (const [i, hash] of hashes.entries()) {
      const key = contentKey(parent, tokens.slice(i * size, (i + 1) * size));
      this.#byContent.set(key, hash);
      this.#content.set(hash, key);
      parent = hash;
    }
    while (this.#content.size > MAX_MIRRORED) {
      const [oldest, key] = this.#content.entries().next().value as [string, string];
      this.#content.delete(oldest);
      this.#byContent.delete(key);
    }
  }

  /** Extends each tracked prompt's matched blocks with what the mirror now holds. */
  #match(): void {
    const now = Date.now();
    const size = this.#blockSize;
    for (const [item, pending] of this.#pending) {
      const total = Math.floor(pending.tokens.length / size);
      const start = pending.matched;
      const found: string[] = [];
      let parent = pending.parent;
      for (let j = start; j < total; j++) {
        const hash = this.#byContent.get(
          contentKey(parent, pending.tokens.slice(j * size, (j + 1) * size)),
        );
        if (hash === undefined) break;
        found.push(hash);
        parent = hash;
      }
      if (found.length > 0) {
        pending.matched += found.length;
        pending.parent = parent;
        this.#listener?.({ kind: "stored", item, start, hashes: found, promptBlocks: total });
      }
      if (pending.matched >= total || pending.until < now) this.#pending.delete(item);
    }
  }
}

/** vLLM's block hashes are 64-bit integers or (newer) bytes: one string form for both. */
function hashKey(value: unknown): string {
  if (value instanceof Uint8Array) return Buffer.from(value).toString("hex");
  return String(value);
}

function contentKey(parent: string | null, tokens: readonly number[]): string {
  return `${parent ?? ""}|${tokens.join(",")}`;
}

/**
 * The prompt tokens of a forwarded body as the engine counts them: vLLM's `POST /tokenize`
 * with the chat messages (its chat template applied) or the first prompt; null when the
 * engine cannot say.
 */
export async function vllmTokenize(
  fetchImpl: typeof fetch,
  base: string,
  auth: Record<string, string>,
  path: string,
  body: string,
): Promise<number[] | null> {
  const parsed = JSON.parse(body) as {
    model?: unknown;
    messages?: unknown;
    prompt?: unknown;
    input?: unknown;
    instructions?: unknown;
  };
  const prompt = Array.isArray(parsed.prompt) ? parsed.prompt[0] : parsed.prompt;
  const request =
    path === "/v1/chat/completions"
      ? { model: parsed.model, messages: parsed.messages }
      : path === "/v1/responses"
        ? { model: parsed.model, messages: responsesMessages(parsed) }
        : { model: parsed.model, prompt };
  const response = await fetchImpl(`${base}/tokenize`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: JSON.stringify(request),
  });
  if (!response.ok) {
    await response.body?.cancel();
    return null;
  }
  const answer = (await response.json()) as { tokens?: unknown };
  return Array.isArray(answer.tokens) ? (answer.tokens as number[]) : null;
}
