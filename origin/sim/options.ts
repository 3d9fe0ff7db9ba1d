/**
 * The simulated engine's options (docs/configuration.md, "The simulated engine"): what a
 * user may set, the defaults, and the checks that refuse impossible settings.
 */
import type { Engine } from "../engine.ts";
import type { SimModel } from "./request.ts";
import { DEFAULT_SIM_TIMING, type SimTiming } from "./timing.ts";

/** The step cost model, configurable through {@link SimEngineOptions.timing}. */
export type { SimTiming } from "./timing.ts";

/** Options of {@link createSimEngine}. */
export interface SimEngineOptions {
  /** Models served; requests for others get 404 `model_not_found`. */
  models?: {
    id: string;
    max_model_len: number;
    kind?: "generate" | "embed";
    dimensions?: number;
  }[];
  /** KV capacity in blocks (the simulated GPU memory). */
  kvBlocks?: number;
  /** Tokens per KV block. */
  blockSize?: number;
  /** Most sequences running at once. */
  maxNumSeqs?: number;
  /** Per-step token budget shared by prefill and decode (chunked prefill). */
  maxNumBatchedTokens?: number;
  /** 1 = realistic wall-clock timing, 0 = no delay (still yields between steps), 0.1 = 10x faster. */
  timeScale?: number;
  /** Engine-wide seed: same options give the same bytes for the same request. */
  seed?: number;
  /**
   * Same bytes for the same request even without a `seed`, and a fixed `created`: for
   * tests that compare answers. Otherwise a request without a seed samples anew.
   */
  deterministic?: boolean;
  /** `created` of responses: fixed epoch seconds, or the wall clock (default; fixed when deterministic). */
  created?: number | "clock";
  /** Step cost model; missing fields take {@link DEFAULT_SIM_TIMING}. */
  timing?: Partial<SimTiming>;
}

/** {@link SimEngineOptions} with every default filled in. */
export interface ResolvedSimEngineOptions {
  models: SimModel[];
  kvBlocks: number;
  blockSize: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  timeScale: number;
  seed: number;
  deterministic: boolean;
  created: number | "clock";
  timing: SimTiming;
}

/** The simulated engine: an {@link Engine} that also shows the options it runs with. */
export type SimEngine = Engine & { readonly options: ResolvedSimEngineOptions };

/** Models served when none are configured. */
export const DEFAULT_SIM_MODELS: readonly SimModel[] = [
  { id: "warmgate-sim-8b", max_model_len: 32768 },
  { id: "warmgate-sim-70b", max_model_len: 8192 },
  { id: "warmgate-sim-embed", max_model_len: 8192, kind: "embed", dimensions: 768 },
];

/** 2026-01-01T00:00:00Z, the fixed `created` of the deterministic mode. */
export const DEFAULT_CREATED = 1767225600;

function positiveInteger(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new RangeError(`${name} must be a positive integer, got ${value}`);
  }
  return value;
}

/** Fills defaults and rejects impossible settings (a configuration bug, so it throws). */
export function resolveSimEngineOptions(options: SimEngineOptions = {}): ResolvedSimEngineOptions {
  const models = (options.models ?? DEFAULT_SIM_MODELS).map((m): SimModel => ({
    id: m.id,
    max_model_len: positiveInteger(`max_model_len of ${m.id}`, m.max_model_len),
    ...(m.kind === "embed"
      ? { kind: "embed", dimensions: positiveInteger(`dimensions of ${m.id}`, m.dimensions ?? 768) }
      : {}),
  }));
  if (models.length === 0) throw new RangeError("the simulated engine needs at least one model");
  const timeScale = options.timeScale ?? 1;
  if (!Number.isFinite(timeScale) || timeScale < 0) {
    throw new RangeError(`timeScale must be a finite number >= 0, got ${timeScale}`);
  }
  const timing = { ...DEFAULT_SIM_TIMING, ...options.timing };
  for (const [key, value] of Object.entries(timing)) {
    if (!Number.isFinite(value) || value < 0) throw new RangeError(`timing.${key} must be >= 0`);
  }
  const deterministic = options.deterministic ?? false;
  const created = options.created ?? (deterministic ? DEFAULT_CREATED : "clock");
  if (created !== "clock" && !Number.isInteger(created)) {
    throw new RangeError(`created must be an integer or "clock", got ${created}`);
  }
  return {
    models,
    kvBlocks: positiveInteger("kvBlocks", options.kvBlocks ?? 8192),
    blockSize: positiveInteger("blockSize", options.blockSize ?? 16),
    maxNumSeqs: positiveInteger("maxNumSeqs", options.maxNumSeqs ?? 64),
    maxNumBatchedTokens: positiveInteger(
      "maxNumBatchedTokens",
      options.maxNumBatchedTokens ?? 2048,
    ),
    timeScale,
    seed: Math.trunc(options.seed ?? 0),
    deterministic,
    created,
    timing,
  };
}
