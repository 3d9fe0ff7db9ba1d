/**
 * The `openai` engine: forwards each item to a real engine's OpenAI-compatible URL
 * (vLLM, SGLang, llama.cpp server, Ollama) over kept-alive connections, learns usage
 * from the stream, and reads load from the engine's Prometheus metrics when it has them.
 * See docs/configuration.md, "The origin".
 */
import { VllmKvEvents, vllmTokenize } from "./vllm-kv-events.ts";
import { describeFetchError, errorOf, jsonError, responseError } from "./openai-errors.ts";
import type {
  Engine,
  EngineHealth,
  EngineItem,
  EngineModel,
  EngineOutcome,
  EngineResponse,
} from "./engine.ts";
import { IDLE_LOAD, type ItemUsage, type LoadReport } from "../contracts/protocol/schema.ts";
import type { ErrorCode } from "../contracts/errors.ts";
import { type Scrape, meanStepMs, parsePrometheus } from "./engine-metrics.ts";
import {
  RESPONSE_END_EVENTS,
  SseSplitter,
  dataOf,
  hideInjectedUsage,
  objectOrNull,
  requestUsage,
  takesStreamOptions,
  toItemUsage,
} from "./sse-usage.ts";

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
  /**
   * The engine runs vLLM's `--scheduling-policy priority`: each request carries the item's
   * priority in vLLM's `priority` field (default false; vLLM refuses the field otherwise).
   */
  priority?: boolean;
  /** The fetch to use (tests). Node's fetch keeps connections alive per origin. */
  fetch?: typeof fetch;
  /**
   * vLLM's KV-cache event publisher (`--kv-events-config '{"enable_kv_cache_events": true,
   * "publisher": "zmq", "endpoint": "tcp://*:5557"}'`): the origin then reports the blocks
   * the engine holds to the edge's router.
   */
  kvEvents?: { endpoint: string; topic?: string };
}

/** Error code of an item whose engine could not be reached. */
export const ENGINE_UNREACHABLE_CODE = "engine_unreachable" satisfies ErrorCode;

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

const decoder = new TextDecoder();

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

  const kv =
    options.kvEvents === undefined
      ? null
      : new VllmKvEvents({
          ...options.kvEvents,
          tokenize: (path, body) => vllmTokenize(fetchImpl, base, auth, path, body),
        });

  async function submit(item: EngineItem): Promise<EngineResponse> {
    const started = performance.now();
    if (item.path !== "/v1/embeddings") kv?.track(item.id, item.path, item.body);
    const { body: usageBody, injected } =
      options.requestUsage === false || !takesStreamOptions(item.path)
        ? { body: item.body, injected: false }
        : requestUsage(item.body);
    const body = options.priority === true ? withPriority(usageBody, item.priority) : usageBody;
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
      let failed: EngineOutcome["error"] | null = null;
      let finished = false;
      let broken = false;
      const inspect = (event: Uint8Array): Uint8Array | null => {
        const data = dataOf(decoder.decode(event));
        if (data === null) return event;
        if (data.trim() === "[DONE]") sawDone = true;
        else if (data.includes('"usage"')) {
          const chunk = objectOrNull(data);
          // The Responses API ends on an event that carries the whole response.
          const type = typeof chunk?.type === "string" ? chunk.type : null;
          const ended = type !== null && RESPONSE_END_EVENTS.has(type);
          if (ended) {
            sawDone = true;
            if (type === "response.failed") failed = responseError(chunk);
          }
          const u = ended
            ? (chunk?.response as { usage?: unknown } | undefined)?.usage
            : chunk?.usage;
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
        } else if (failed !== null) {
          settle({ ...common, outcome: "error", error: failed });
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
    ...(kv !== null && { onBlocks: (listener) => kv.onBlocks(listener) }),
    load(): Omit<LoadReport, "origin" | "t"> {
      const maxNumSeqs = options.maxNumSeqs ?? 0;
      if (scrape === null) {
        // No engine metrics (llama.cpp, Ollama): what this origin itself has in flight.
        return { ...IDLE_LOAD, running: inFlight, max_num_seqs: maxNumSeqs };
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
      kv?.close();
      for (const timer of timers) clearInterval(timer);
      return Promise.resolve();
    },
  };
}

/**
 * The body with vLLM's `priority` field, where the client did not set one: vLLM runs lower
 * values first, the batch protocol higher ones, so the item's priority goes in negated.
 * Textual insertion keeps every other byte of the client's body as it was.
 */
export function withPriority(body: string, priority: number): string {
  const request = objectOrNull(body);
  const value = -Math.round(priority);
  if (request === null || "priority" in request || value === 0) return body;
  const at = body.indexOf("{");
  const rest = body.slice(at + 1);
  const separator = /^\s*\}/.test(rest) ? "" : ",";
  return `${body.slice(0, at + 1)}"priority":${value}${separator}${rest}`;
}
