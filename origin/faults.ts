/**
 * Fault injection for an origin, whatever engine runs behind it: injected error
 * statuses, added latency, hangs before the first byte, and streams cut mid-way.
 *
 * Decisions come from a seeded PRNG drawn once per item in submission order, so a
 * test or a benchmark with the same seed and the same request order sees the same faults.
 * See docs/configuration.md, "The origin".
 */
import { z } from "zod";
import { type ErrorCode, type OpenAIErrorBody, openAIErrorBody } from "../contracts/errors.ts";
import type { Engine, EngineItem, EngineOutcome, EngineResponse } from "./engine.ts";

/** Statuses an injected error may carry (rate limited, internal error, unavailable). */
export const FAULT_STATUSES = [429, 500, 503] as const;

/** Error code of an item whose stream the origin cut on purpose. */
export const STREAM_DROPPED_CODE = "origin_stream_dropped" satisfies ErrorCode;
/** Error code in the body of an injected error response. */
export const FAULT_ERROR_CODE = "origin_fault_injected" satisfies ErrorCode;

/** Validates a (partial) fault configuration, as `PUT /admin/faults` and the CLI give it. */
export const FaultConfigSchema = z
  .object({
    /** Fraction of items answered with one of `errorStatuses` instead of running. */
    errorRate: z.number().min(0).max(1),
    errorStatuses: z
      .array(z.union(FAULT_STATUSES.map((s) => z.literal(s))))
      .min(1)
      .transform((statuses): number[] => statuses),
    /** Milliseconds added before each item reaches the engine. */
    latencyMs: z.number().int().min(0).max(600_000),
    /** Fraction of items that never get an answer until they are aborted. */
    hangRate: z.number().min(0).max(1),
    /**
     * Cut an item's stream after this many SSE events (a JSON answer after this many
     * bytes); null turns drops off.
     */
    dropAfterTokens: z.number().int().min(0).nullable(),
    /** Fraction of items cut when `dropAfterTokens` is set. */
    dropRate: z.number().min(0).max(1),
  })
  .strict();

/** The fault configuration of an origin. */
export type FaultConfig = z.infer<typeof FaultConfigSchema>;

/** Validates a partial update of the fault configuration. */
export const FaultConfigPatchSchema = FaultConfigSchema.partial();

/** No faults: what an origin starts with unless told otherwise. */
export const DEFAULT_FAULTS: Readonly<FaultConfig> = Object.freeze({
  errorRate: 0,
  errorStatuses: [500],
  latencyMs: 0,
  hangRate: 0,
  dropAfterTokens: null,
  dropRate: 1,
});

/** The kinds of fault counted in `/metrics`. */
export type FaultKind = "error" | "latency" | "hang" | "drop";

/** What happens to one item. */
export type FaultDecision = {
  latencyMs: number;
  action:
    | { kind: "none" }
    | { kind: "error"; status: number }
    | { kind: "hang" }
    | { kind: "drop"; afterEvents: number };
};

/** Reads and changes an origin's faults at run time. */
export interface FaultController {
  /** Merges a partial configuration into the current one and returns the result. */
  set(partial: Partial<FaultConfig>): FaultConfig;
  get(): FaultConfig;
  /** Back to no faults (the PRNG keeps its position). */
  reset(): FaultConfig;
  /** Draws the fate of the next item. */
  decide(): FaultDecision;
  /** Injections so far, by kind. */
  counts(): Readonly<Record<FaultKind, number>>;
}

/** Options of {@link createFaultController}. */
export interface FaultControllerOptions {
  initial?: Partial<FaultConfig>;
  /** PRNG seed; the same seed and request order give the same faults. */
  seed?: number;
}

/** mulberry32: small, fast and good enough to spread faults evenly. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Creates a fault controller; throws a zod error for an invalid initial configuration. */
export function createFaultController(options: FaultControllerOptions = {}): FaultController {
  const random = mulberry32(options.seed ?? 0x5eed);
  let config: FaultConfig = FaultConfigSchema.parse({ ...DEFAULT_FAULTS, ...options.initial });
  const counts: Record<FaultKind, number> = { error: 0, latency: 0, hang: 0, drop: 0 };
  return {
    set(partial) {
      config = FaultConfigSchema.parse({ ...config, ...partial });
      return { ...config };
    },
    get: () => ({ ...config, errorStatuses: [...config.errorStatuses] }),
    reset() {
      config = { ...DEFAULT_FAULTS, errorStatuses: [...DEFAULT_FAULTS.errorStatuses] };
      return { ...config };
    },
    decide() {
      // Draw every number every time, so changing one rate does not shift the others' draws.
      const errorDraw = random();
      const statusDraw = random();
      const hangDraw = random();
      const dropDraw = random();
      const latencyMs = config.latencyMs;
      if (latencyMs > 0) counts.latency++;
      if (errorDraw < config.errorRate) {
        const statuses = config.errorStatuses;
        const status = statuses[Math.floor(statusDraw * statuses.length)] ?? 500;
        counts.error++;
        return { latencyMs, action: { kind: "error", status } };
      }
      if (hangDraw < config.hangRate) {
        counts.hang++;
        return { latencyMs, action: { kind: "hang" } };
      }
      if (config.dropAfterTokens !== null && dropDraw < config.dropRate) {
        counts.drop++;
        return { latencyMs, action: { kind: "drop", afterEvents: config.dropAfterTokens } };
      }
      return { latencyMs, action: { kind: "none" } };
    },
    counts: () => ({ ...counts }),
  };
}

const encoder = new TextEncoder();

function injectedErrorBody(status: number): OpenAIErrorBody {
  const type = status === 429 ? "rate_limit_error" : "server_error";
  const message =
    status === 429
      ? "The engine is overloaded (injected fault)."
      : status === 503
        ? "The engine is unavailable (injected fault)."
        : "The engine failed (injected fault).";
  return openAIErrorBody(message, type, FAULT_ERROR_CODE);
}

function injectedError(status: number): EngineResponse {
  const headers: Record<string, string> = { "content-type": "application/json" };
  // A 429 or 503 without retry-after leaves OpenAI SDKs guessing; say one second.
  if (status === 429 || status === 503) headers["retry-after"] = "1";
  const body = injectedErrorBody(status);
  const { error } = body;
  return {
    status,
    headers,
    body: (async function* () {
      yield encoder.encode(JSON.stringify(body));
    })(),
    outcome: Promise.resolve({
      outcome: "error",
      usage: null,
      error: { message: error.message, type: error.type, code: FAULT_ERROR_CODE },
      queued_ms: 0,
      ttft_ms: 0,
    }),
  };
}

/** The answer to an item aborted before the engine said anything. */
function abortedBeforeStart(): EngineResponse {
  return {
    status: 499,
    headers: { "content-type": "application/json" },
    body: (async function* () {})(),
    outcome: Promise.resolve({
      outcome: "cancelled",
      usage: null,
      error: { message: "The request was aborted.", type: "server_error", code: "item_aborted" },
      queued_ms: 0,
      ttft_ms: null,
    }),
  };
}

function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** Counts complete SSE events (blank-line terminated) across chunk boundaries. */
function eventCounter(): (chunk: Uint8Array) => number {
  let previous = 0;
  let count = 0;
  return (chunk) => {
    for (const byte of chunk) {
      if (byte === 0x0a && previous === 0x0a) count++;
      // A lone \r between two \n (CRLF framing) does not break the blank line.
      if (byte !== 0x0d) previous = byte;
    }
    return count;
  };
}

function dropAfter(
  response: EngineResponse,
  afterEvents: number,
  inner: AbortController,
  signal: AbortSignal,
): EngineResponse {
  let dropped = false;
  const isSse = (response.headers["content-type"] ?? "").includes("text/event-stream");
  const count = eventCounter();
  async function* body(): AsyncGenerator<Uint8Array> {
    let events = 0;
    for await (const chunk of response.body) {
      if (!isSse && events < afterEvents && events + chunk.byteLength > afterEvents) {
        // A JSON answer is cut inside its bytes, so a reader sees a partial body.
        yield chunk.subarray(0, afterEvents - events);
        events = afterEvents;
      }
      if (events >= afterEvents) {
        dropped = true;
        // Stop generation: a cut stream must free its slot as a real disconnect would.
        inner.abort(new Error("stream dropped"));
        break;
      }
      yield chunk;
      events = isSse ? count(chunk) : events + chunk.byteLength;
    }
  }
  const outcome = (async (): Promise<EngineOutcome> => {
    const original = await response.outcome;
    if (!dropped || (signal.aborted && original.outcome !== "ok")) return original;
    return {
      ...original,
      outcome: "error",
      error: {
        message: "The origin cut the stream (injected fault).",
        type: "server_error",
        code: STREAM_DROPPED_CODE,
      },
    };
  })();
  return { status: response.status, headers: response.headers, body: body(), outcome };
}

/** Wraps an engine so each submitted item meets the controller's faults first. */
export function withFaults(engine: Engine, faults: FaultController): Engine {
  return {
    kind: engine.kind,
    ...(engine.onBlocks !== undefined && {
      onBlocks: (listener: Parameters<NonNullable<Engine["onBlocks"]>>[0]) =>
        engine.onBlocks?.(listener),
    }),
    models: () => engine.models(),
    load: () => engine.load(),
    metrics: () => engine.metrics(),
    health: () => engine.health(),
    close: () => engine.close(),
    async submit(item: EngineItem): Promise<EngineResponse> {
      const decision = faults.decide();
      if (decision.latencyMs > 0 && !(await sleep(decision.latencyMs, item.signal))) {
        return abortedBeforeStart();
      }
      const action = decision.action;
      switch (action.kind) {
        case "none":
          return engine.submit(item);
        case "error":
          return injectedError(action.status);
        case "hang":
          // The engine accepted the request and never answered: only an abort ends it.
          await new Promise<void>((resolve) => {
            if (item.signal.aborted) resolve();
            else item.signal.addEventListener("abort", () => resolve(), { once: true });
          });
          return abortedBeforeStart();
        case "drop": {
          const inner = new AbortController();
          const signal = AbortSignal.any([item.signal, inner.signal]);
          const response = await engine.submit({ ...item, signal });
          return dropAfter(response, action.afterEvents, inner, item.signal);
        }
        default:
          return action satisfies never;
      }
    },
  };
}
