/**
 * The contract between the origin server and an inference engine.
 *
 * The origin turns each HTTP request (or batch item) into an {@link EngineItem} and
 * writes the {@link EngineResponse} back unchanged. Two engines implement it: the
 * built-in simulated engine (`origin/sim/`) and the OpenAI-compatible forwarder
 * (`origin/openai-engine.ts`) for vLLM, SGLang, llama.cpp server, Ollama, ….
 * See docs/configuration.md, "The origin".
 */
import type { ItemOutcome, ItemPath, ItemUsage, LoadReport } from "../contracts/protocol/schema.ts";

/** One OpenAI-compatible request handed to an engine. */
export interface EngineItem {
  /** Request id, unique on this origin while the item runs. */
  id: string;
  path: ItemPath;
  /** The client's JSON body as raw text; unknown fields must reach the engine untouched. */
  body: string;
  /** Lower-case request headers worth forwarding. */
  headers: Record<string, string>;
  /** Aborted when the item is cancelled, its client goes away or it times out. */
  signal: AbortSignal;
  /** Higher runs first when the engine has to queue. */
  priority: number;
}

/** What ended an item, and the usage to bill. Resolves once the body is finished. */
export interface EngineOutcome {
  outcome: ItemOutcome;
  usage: ItemUsage | null;
  error?: { message: string; type: string; code: string | null };
  /** Milliseconds the item waited before the engine started it. */
  queued_ms: number;
  /** Milliseconds from submit to the first body byte, null if none came. */
  ttft_ms: number | null;
  /** The answer of an earlier run of the same background item, sent again (not run). */
  replayed?: boolean;
}

/** The engine's answer to one item. */
export interface EngineResponse {
  status: number;
  /** Response headers (lower-case), e.g. `content-type: text/event-stream`. */
  headers: Record<string, string>;
  /**
   * The body, chunk by chunk, exactly as the client should receive it. Iteration
   * ends early (without throwing) when the item is aborted or fails mid-stream;
   * `outcome` then says why.
   */
  body: AsyncIterable<Uint8Array>;
  /** Settles after `body` is exhausted; never rejects. */
  outcome: Promise<EngineOutcome>;
}

/** A model as `GET /v1/models` lists it (vLLM's shape). */
export interface EngineModel {
  id: string;
  /** Context window in tokens. */
  max_model_len: number;
  owned_by: string;
}

/** Health detail an engine adds to the origin's `GET /health`. */
export interface EngineHealth {
  ok: boolean;
  engine: "sim" | "openai";
  detail?: string;
}

/**
 * A change to the engine's prefix cache in its own block hashes (vLLM's KV-cache events):
 * blocks of an item's prompt stored from chain position `start` (of `promptBlocks` full
 * blocks in the prompt), blocks evicted, or the whole cache dropped.
 */
export type EngineBlockEvent =
  | { kind: "stored"; item: string; start: number; hashes: EngineBlockHash[]; promptBlocks: number }
  | { kind: "removed"; hashes: EngineBlockHash[] }
  | { kind: "cleared" };

/** An engine's own name for a block: a number (the simulated engine) or a string (vLLM's). */
export type EngineBlockHash = number | string;

/** An inference engine behind the origin. */
export interface Engine {
  readonly kind: "sim" | "openai";
  /** Models served, for `GET /v1/models`. */
  models(): EngineModel[];
  /** Starts an item. Never rejects: engine failures come back as a status and body. */
  submit(item: EngineItem): Promise<EngineResponse>;
  /** The engine's load now (without `origin` and `t`, which the server adds). */
  load(): Omit<LoadReport, "origin" | "t">;
  /** Prometheus text for engine metrics (vLLM names), without a trailing blank line. */
  metrics(): string;
  health(): Promise<EngineHealth>;
  /**
   * Follows the prefix cache's changes, where the engine can say exactly what it holds;
   * absent where it cannot.
   */
  onBlocks?(listener: (event: EngineBlockEvent) => void): void;
  /** Stops background work and frees resources. */
  close(): Promise<void>;
}
