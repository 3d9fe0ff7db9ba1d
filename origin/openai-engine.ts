/**
 * The `openai` engine: forwards each item to a real engine's OpenAI-compatible URL
 * (vLLM, SGLang, llama.cpp server, Ollama) over kept-alive connections, learns usage
 * from the stream, and reads load from the engine's Prometheus metrics when it has them.
 */
import type {
  Engine,
  EngineHealth,
  EngineItem,
  EngineModel,
  EngineOutcome,
  EngineResponse,
} from "./engine.ts";
import type { ItemUsage, LoadReport } from "../contracts/protocol.ts";

/** Options of {@link createOpenAIEngine}. */
export interface OpenAIEngineOptions {
  /** Base URL of the engine, without `/v1` (e.g. `http://127.0.0.1:8000`). */
  url: string;
  /** Bearer key the engine expects (vLLM `--api-key`). */
  apiKey?: string;
  /** Models to list instead of asking the engine (engines that do not report context windows). */
  models?: { id: string; max_model_len: number; owned_by?: string }[];
  /** Milliseconds between `/v1/models` refreshes (default 30 000). */
  modelsRefreshMs?: number;
  /** Milliseconds between `/metrics` scrapes (default 1000; 0 turns scraping off). */
  metricsIntervalMs?: number;
  /** Concurrency limit reported in load reports when the engine does not say (default 0: unknown). */
  maxNumSeqs?: number;
  /**
   * Add `stream_options.include_usage` to streams whose client left it out, so usage is
   * known (default true); turn off for engines that refuse the option.
   */
  requestUsage?: boolean;
  /** The fetch to use (tests). Node's fetch keeps connections alive per origin. */
  fetch?: typeof fetch;
}

/** Error code of an item whose engine could not be reached. */
export const ENGINE_UNREACHABLE_CODE = "engine_unreachable";

/** Response headers that describe the engine's server, not the response. */
const DROPPED_HEADERS = new Set([
  "date",
  "server",
  "connection",
  "keep-alive",
  "transfer-encoding",
]);
/** Client headers never forwarded: the origin speaks for itself to the engine. */
const UNFORWARDED = new Set([
  "authorization",
  "host",
  "content-length",
  "connection",
  "content-type",
]);

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A metric family summed over its label sets, and the label sets themselves. */
interface Scrape {
  text: string;
  sums: Map<string, number>;
  labels: Map<string, Record<string, string>>;
}

/** Parses Prometheus text exposition into per-name sums (engines label by model). */
export function parsePrometheus(text: string): Scrape {
  const sums = new Map<string, number>();
  const labels = new Map<string, Record<string, string>>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/.exec(line);
    if (match === null) continue;
    const name = match[1] ?? "";
    const value = Number(match[3]);
    if (!Number.isFinite(value)) continue;
    sums.set(name, (sums.get(name) ?? 0) + value);
    if (match[2] !== undefined && !labels.has(name)) {
      const set: Record<string, string> = {};
      for (const pair of match[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
        set[pair[1] ?? ""] = pair[2] ?? "";
      }
      labels.set(name, set);
    }
  }
  return { text, sums, labels };
}

/** Inter-token latency histograms, newest name first: an engine step, seen by a sequence. */
const INTER_TOKEN_FAMILIES = [
  "vllm:inter_token_latency_seconds",
  "vllm:time_per_output_token_seconds",
  "sglang:inter_token_latency_seconds",
  "sglang:time_per_output_token_seconds",
];

/**
 * The mean inter-token latency (ms) over the tokens between two scrapes, from the first
 * histogram family both publish; null when no token came between them (or the engine
 * restarted, and its counters with it).
 */
export function meanStepMs(before: Scrape | null, after: Scrape): number | null {
  if (before === null) return null;
  for (const family of INTER_TOKEN_FAMILIES) {
    const count = (scrape: Scrape) => scrape.sums.get(`${family}_count`);
    const sum = (scrape: Scrape) => scrape.sums.get(`${family}_sum`);
    const [c0, c1, s0, s1] = [count(before), count(after), sum(before), sum(after)];
    if (c0 === undefined || c1 === undefined || s0 === undefined || s1 === undefined) continue;
    if (c1 <= c0 || s1 < s0) return null;
    return ((s1 - s0) / (c1 - c0)) * 1000;
  }
  return null;
}

/** Splits an SSE byte stream into whole events (each with its blank-line terminator). */
export class SseSplitter {
  #buffer = new Uint8Array(0);

  /** Adds a chunk and returns the events it completes, byte for byte. */
  push(chunk: Uint8Array): Uint8Array[] {
    const data = new Uint8Array(this.#buffer.byteLength + chunk.byteLength);
    data.set(this.#buffer);
    data.set(chunk, this.#buffer.byteLength);
    const events: Uint8Array[] = [];
    let start = 0;
    for (let i = 0; i < data.byteLength; i++) {
      if (data[i] !== 0x0a) continue;
      // An event ends at "\n\n" or "\n\r\n" (CRLF line endings, per the SSE spec).
      if (data[i + 1] === 0x0a) {
        events.push(data.slice(start, i + 2));
        start = i + 2;
        i++;
      } else if (data[i + 1] === 0x0d && data[i + 2] === 0x0a) {
        events.push(data.slice(start, i + 3));
        start = i + 3;
        i += 2;
      }
    }
    this.#buffer = data.slice(start);
    return events;
  }

  /** Whatever is left when the stream ends (an unterminated event), possibly empty. */
  flush(): Uint8Array {
    const rest = this.#buffer;
    this.#buffer = new Uint8Array(0);
    return rest;
  }
}

interface UsageJson {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
}

function toItemUsage(usage: UsageJson): ItemUsage {
  const prompt = usage.prompt_tokens ?? 0;
  const completion = usage.completion_tokens ?? 0;
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: usage.total_tokens ?? prompt + completion,
    cached_tokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

function objectOrNull(text: string): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === "object" && value !== null && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : null;
  } catch {
    return null;
  }
}

/**
 * Asks a streaming request for usage when the client did not, so the origin can bill it.
 * Returns the body to send and whether the engine's usage output must be hidden again.
 */
export function requestUsage(body: string): { body: string; injected: boolean } {
  const request = objectOrNull(body);
  if (request === null || request.stream !== true) return { body, injected: false };
  const options = request.stream_options;
  if (options === null) {
    return {
      body: JSON.stringify({ ...request, stream_options: { include_usage: true } }),
      injected: true,
    };
  }
  if (options === undefined) {
    // Textual insertion keeps every other byte of the client's body as it was.
    const at = body.indexOf("{");
    const rest = body.slice(at + 1);
    const separator = /^\s*\}/.test(rest) ? "" : ",";
    return {
      body: `${body.slice(0, at + 1)}"stream_options":{"include_usage":true}${separator}${rest}`,
      injected: true,
    };
  }
  if (
    typeof options === "object" &&
    (options as { include_usage?: unknown }).include_usage !== true
  ) {
    return {
      body: JSON.stringify({ ...request, stream_options: { ...options, include_usage: true } }),
      injected: true,
    };
  }
  return { body, injected: false };
}

const USAGE_NULL_AFTER = /,\s*"usage"\s*:\s*null(?=\s*[,}])/g;
const USAGE_NULL_BEFORE = /"usage"\s*:\s*null\s*,\s*/g;

/**
 * What the client would have received for one SSE event had it not asked for usage:
 * null for the usage-only chunk, the event without its `"usage":null` otherwise.
 */
export function hideInjectedUsage(event: Uint8Array): Uint8Array | null {
  const text = decoder.decode(event);
  if (!text.includes('"usage"')) return event;
  const data = dataOf(text);
  if (data !== null) {
    const chunk = objectOrNull(data);
    if (
      chunk !== null &&
      Array.isArray(chunk.choices) &&
      chunk.choices.length === 0 &&
      chunk.usage !== null &&
      chunk.usage !== undefined
    ) {
      return null;
    }
  }
  // A raw `"usage"` can only be a key: quotes inside JSON strings are escaped.
  let edited = text.replace(USAGE_NULL_AFTER, "");
  if (edited === text) edited = text.replace(USAGE_NULL_BEFORE, "");
  return edited === text ? event : encoder.encode(edited);
}

/** The joined `data:` lines of one SSE event, or null when it has none. */
function dataOf(event: string): string | null {
  const lines: string[] = [];
  for (const line of event.split(/\r?\n/)) {
    if (line.startsWith("data:")) lines.push(line.slice(line.startsWith("data: ") ? 6 : 5));
  }
  return lines.length > 0 ? lines.join("\n") : null;
}

function describeFetchError(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause;
    if (typeof cause === "object" && cause !== null && "code" in cause) return String(cause.code);
    // undici wraps the socket error ("fetch failed"); the cause says what really happened.
    if (cause instanceof Error && cause.message !== "") return cause.message;
    return error.message;
  }
  return String(error);
}

function jsonError(status: number, message: string, type: string, code: string): EngineResponse {
  const text = JSON.stringify({ error: { message, type, param: null, code } });
  return {
    status,
    headers: { "content-type": "application/json" },
    body: (async function* () {
      yield encoder.encode(text);
    })(),
    outcome: Promise.resolve({
      outcome: status === 499 ? "cancelled" : "error",
      usage: null,
      error: { message, type, code },
      queued_ms: 0,
      ttft_ms: null,
    }),
  };
}

function errorOf(text: string, status: number): NonNullable<EngineOutcome["error"]> {
  const body = objectOrNull(text);
  const error = body?.error;
  if (typeof error === "object" && error !== null) {
    const e = error as { message?: unknown; type?: unknown; code?: unknown };
    return {
      message: typeof e.message === "string" ? e.message : `engine answered ${status}`,
      type: typeof e.type === "string" ? e.type : "server_error",
      code:
        typeof e.code === "string" ? e.code : typeof e.code === "number" ? String(e.code) : null,
    };
  }
  // vLLM and FastAPI also answer {"detail": …} or {"message": …} for some errors.
  const message =
    typeof body?.message === "string"
      ? body.message
      : typeof body?.detail === "string"
        ? body.detail
        : `engine answered ${status}`;
  return { message, type: status >= 500 ? "server_error" : "invalid_request_error", code: null };
}

/** Most bytes of a non-streaming body kept to read its usage. */
const MAX_COLLECTED_BYTES = 16 * 1024 * 1024;

/** Creates an engine that forwards to an OpenAI-compatible server at `options.url`. */
export function createOpenAIEngine(options: OpenAIEngineOptions): Engine {
  const base = options.url.replace(/\/+$/, "");
  const fetchImpl = options.fetch ?? fetch;
  const auth: Record<string, string> =
    options.apiKey === undefined ? {} : { authorization: `Bearer ${options.apiKey}` };
  let models: EngineModel[] = (options.models ?? []).map((m) => ({
    id: m.id,
    max_model_len: m.max_model_len,
    owned_by: m.owned_by ?? "engine",
  }));
  let unreachable: string | null = null;
  let scrape: Scrape | null = null;
  // The engine's mean step time (ms) between the last two scrapes that saw tokens; 0: unknown.
  let stepMs = 0;
  let inFlight = 0;
  let closed = false;
  const timers: ReturnType<typeof setInterval>[] = [];

  async function refreshModels(): Promise<void> {
    const response = await fetchImpl(`${base}/v1/models`, { headers: auth });
    if (!response.ok) {
      await response.body?.cancel();
      throw new Error(`GET /v1/models answered ${response.status}`);
    }
    const list = (await response.json()) as { data?: Record<string, unknown>[] };
    if (options.models !== undefined) return;
    models = (list.data ?? []).flatMap((m) => {
      if (typeof m.id !== "string") return [];
      const len = m.max_model_len ?? m.context_length ?? m.context_window;
      return [
        {
          id: m.id,
          max_model_len: typeof len === "number" ? len : 0,
          owned_by: typeof m.owned_by === "string" ? m.owned_by : "engine",
        },
      ];
    });
  }

  async function scrapeMetrics(): Promise<void> {
    try {
      const response = await fetchImpl(`${base}/metrics`, { headers: auth });
      if (!response.ok) {
        await response.body?.cancel();
        scrape = null;
        return;
      }
      const parsed = parsePrometheus(await response.text());
      // Only engines that publish vLLM or SGLang names can tell us their load.
      const known = [...parsed.sums.keys()].some(
        (name) => name.startsWith("vllm:") || name.startsWith("sglang:"),
      );
      if (known) stepMs = meanStepMs(scrape, parsed) ?? stepMs;
      scrape = known ? parsed : null;
    } catch {
      scrape = null;
    }
  }

  async function check(): Promise<EngineHealth> {
    try {
      await refreshModels();
      unreachable = null;
      return { ok: true, engine: "openai", detail: `forwarding to ${base}` };
    } catch (error) {
      const detail = `engine unreachable at ${base}: ${describeFetchError(error)}`;
      unreachable = detail;
      return { ok: false, engine: "openai", detail };
    }
  }

  void check();
  const metricsInterval = options.metricsIntervalMs ?? 1000;
  if (metricsInterval > 0) {
    void scrapeMetrics();
    timers.push(setInterval(() => void scrapeMetrics(), metricsInterval));
  }
  timers.push(setInterval(() => void check(), options.modelsRefreshMs ?? 30_000));
  // Background refreshes must not keep a finished process alive.
  for (const timer of timers) timer.unref();

  function sum(...names: string[]): number | undefined {
    for (const name of names) {
      const value = scrape?.sums.get(name);
      if (value !== undefined) return value;
    }
    return undefined;
  }

  async function submit(item: EngineItem): Promise<EngineResponse> {
    const started = performance.now();
    const { body, injected } =
      options.requestUsage === false
        ? { body: item.body, injected: false }
        : requestUsage(item.body);
    const headers: Record<string, string> = { ...auth, "content-type": "application/json" };
    for (const [name, value] of Object.entries(item.headers)) {
      if (!UNFORWARDED.has(name)) headers[name] = value;
    }
    let response: Response;
    inFlight++;
    try {
      response = await fetchImpl(`${base}${item.path}`, {
        method: "POST",
        headers,
        body,
        signal: item.signal,
      });
    } catch (error) {
      inFlight--;
      if (item.signal.aborted) {
        return jsonError(499, "The request was cancelled.", "server_error", "item_cancelled");
      }
      unreachable = `engine unreachable at ${base}: ${describeFetchError(error)}`;
      return jsonError(502, unreachable, "server_error", ENGINE_UNREACHABLE_CODE);
    }
    unreachable = null;

    const outHeaders: Record<string, string> = {};
    for (const [name, value] of response.headers) {
      if (!DROPPED_HEADERS.has(name)) outHeaders[name] = value;
    }
    const isSse = (response.headers.get("content-type") ?? "").includes("text/event-stream");
    const ok = response.ok;
    const status = response.status;
    const { promise: outcome, resolve: settle } = Promise.withResolvers<EngineOutcome>();

    async function* stream(): AsyncGenerator<Uint8Array> {
      const reader = (response.body ?? new ReadableStream<Uint8Array>()).getReader();
      const splitter = isSse ? new SseSplitter() : null;
      const collected: Uint8Array[] = [];
      let collectedBytes = 0;
      let ttft: number | null = null;
      let usage: ItemUsage | null = null;
      let sawDone = false;
      let finished = false;
      let broken = false;
      const inspect = (event: Uint8Array): Uint8Array | null => {
        const data = dataOf(decoder.decode(event));
        if (data === null) return event;
        if (data.trim() === "[DONE]") sawDone = true;
        else if (data.includes('"usage"')) {
          const chunk = objectOrNull(data);
          const u = chunk?.usage;
          if (typeof u === "object" && u !== null) usage = toItemUsage(u);
        }
        return injected ? hideInjectedUsage(event) : event;
      };
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          ttft ??= performance.now() - started;
          if (splitter === null) {
            if (collectedBytes < MAX_COLLECTED_BYTES) {
              collected.push(value);
              collectedBytes += value.byteLength;
            }
            yield value;
            continue;
          }
          for (const event of splitter.push(value)) {
            const out = inspect(event);
            if (out !== null) yield out;
          }
        }
        if (splitter !== null) {
          const rest = splitter.flush();
          if (rest.byteLength > 0) yield rest;
        }
        finished = true;
      } catch {
        broken = true;
      } finally {
        if (!finished) await reader.cancel().catch(() => {});
        inFlight--;
        const text = splitter === null ? decoder.decode(Buffer.concat(collected)) : "";
        if (splitter === null && ok) {
          const u = objectOrNull(text)?.usage;
          if (typeof u === "object" && u !== null) usage = toItemUsage(u);
        }
        const common = { usage, queued_ms: 0, ttft_ms: ttft === null ? null : Math.round(ttft) };
        if (item.signal.aborted && !(finished && (sawDone || !isSse))) {
          settle({ ...common, outcome: "cancelled" });
        } else if (!ok) {
          settle({ ...common, outcome: "error", error: errorOf(text, status) });
        } else if (broken || !finished || (isSse && !sawDone)) {
          settle({
            ...common,
            outcome: "error",
            error: {
              message: "The engine's stream ended before it was complete.",
              type: "server_error",
              code: "engine_stream_truncated",
            },
          });
        } else {
          settle({ ...common, outcome: "ok" });
        }
      }
    }

    return { status, headers: outHeaders, body: stream(), outcome };
  }

  return {
    kind: "openai",
    models: () => models,
    submit,
    load(): Omit<LoadReport, "origin" | "t"> {
      const maxNumSeqs = options.maxNumSeqs ?? 0;
      if (scrape === null) {
        // No engine metrics (llama.cpp, Ollama): what this origin itself has in flight.
        return {
          running: inFlight,
          waiting: 0,
          kv_usage: 0,
          kv_free_blocks: 0,
          kv_total_blocks: 0,
          block_size: 0,
          prefix_queries: 0,
          prefix_hits: 0,
          max_num_seqs: maxNumSeqs,
        };
      }
      const cacheInfo = scrape.labels.get("vllm:cache_config_info") ?? {};
      const totalBlocks = Number(cacheInfo.num_gpu_blocks ?? 0) || 0;
      const kvUsage =
        sum("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage") ?? 0;
      return {
        running: sum("vllm:num_requests_running", "sglang:num_running_reqs") ?? inFlight,
        waiting: sum("vllm:num_requests_waiting", "sglang:num_queue_reqs") ?? 0,
        kv_usage: kvUsage,
        kv_free_blocks: Math.max(0, Math.round(totalBlocks * (1 - kvUsage))),
        kv_total_blocks: totalBlocks,
        block_size: Number(cacheInfo.block_size ?? 0) || 0,
        prefix_queries:
          sum("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total") ?? 0,
        prefix_hits: sum("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total") ?? 0,
        max_num_seqs: maxNumSeqs,
        step_ms: Math.round(stepMs * 100) / 100,
      };
    },
    metrics(): string {
      if (scrape === null) return "";
      // Republish the engine's own families so one scrape of the origin sees both.
      return scrape.text
        .split("\n")
        .filter((line) => {
          const name = line.startsWith("#") ? (line.split(" ")[2] ?? "") : line;
          return name.startsWith("vllm:") || name.startsWith("sglang:");
        })
        .join("\n");
    },
    async health(): Promise<EngineHealth> {
      if (closed) return { ok: false, engine: "openai", detail: "closed" };
      return check();
    },
    close(): Promise<void> {
      closed = true;
      for (const timer of timers) clearInterval(timer);
      return Promise.resolve();
    },
  };
}
