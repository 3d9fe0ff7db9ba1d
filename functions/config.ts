/**
 * The gateway's configuration: models, regions and their origins, and request limits.
 *
 * It arrives as JSON in the `WARMGATE_CONFIG` var, is validated with zod once per isolate
 * (cached by its text) and every problem names the field at fault.
 * See docs/configuration.md.
 */
import { z } from "zod";
import { BATCHING_FIELDS } from "../durable-objects/batcher/settings.ts";
import { BreakersConfigSchema } from "../durable-objects/origin-breakers/settings.ts";
import { CanaryConfigSchema } from "../durable-objects/canaries/settings.ts";
import {
  MAX_ROUTED_ORIGINS,
  RoutingConfigSchema,
  routingEnabled,
} from "../durable-objects/batcher/settings.ts";
import { AliasesSchema, ModelPricingSchema, aliasIssues } from "./pricing.ts";

/** Default request limits; 8 MB bodies match OpenAI's documented request size cap. */
export const DEFAULT_LIMITS = {
  max_body_bytes: 8 * 1024 * 1024,
  first_byte_timeout_ms: 30_000,
  request_timeout_ms: 600_000,
  retry_budget: 2,
  retry_ratio: 0.1,
  retry_floor: 10,
} as const;

const id = z.string().min(1).max(128);

/** A model the gateway serves, as `GET /v1/models` lists it. */
export const ModelConfigSchema = z.strictObject({
  id,
  /** Context window in tokens, as vLLM reports it. */
  max_model_len: z.int().positive(),
  owned_by: z.string().min(1).default("warmgate"),
  /** Other names that resolve to this model (the first model listing an alias wins). */
  aliases: z.array(id).default([]),
  /** USD per 1M input, cached input and output tokens; a model without prices is free. */
  pricing: ModelPricingSchema.optional(),
});

/** One origin server inside a region. */
export const OriginConfigSchema = z.strictObject({
  id,
  url: z.url({ protocol: /^https?$/ }),
  /** Models this origin serves; absent means every configured model. */
  models: z.array(id).optional(),
  /**
   * Names of the secrets whose values the edge presents to this origin as bearer tokens,
   * in order of rotation (default `["ORIGIN_TOKEN"]`): a 401 or 429 moves to the next.
   */
  credentials: z
    .array(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "a secret's name"))
    .min(1)
    .max(8)
    .optional(),
});

/** A region: where its callers are (Cloudflare colos, countries, continents) and its origins. */
export const RegionConfigSchema = z.strictObject({
  id,
  continents: z.array(z.string().length(2)).default([]),
  countries: z.array(z.string().length(2)).default([]),
  colos: z.array(z.string().min(3).max(4)).default([]),
  origins: z.array(OriginConfigSchema).min(1),
});

/** Request limits; every field optional with {@link DEFAULT_LIMITS}. */
export const LimitsConfigSchema = z.strictObject({
  max_body_bytes: z.int().positive().default(DEFAULT_LIMITS.max_body_bytes),
  first_byte_timeout_ms: z.int().positive().default(DEFAULT_LIMITS.first_byte_timeout_ms),
  request_timeout_ms: z.int().positive().default(DEFAULT_LIMITS.request_timeout_ms),
  /** Extra origins tried after the first fails before any byte reached the client. */
  retry_budget: z.int().min(0).max(10).default(DEFAULT_LIMITS.retry_budget),
  /** Retries an isolate makes at most, as a share of its requests over 10 s... */
  retry_ratio: z.number().min(0).max(10).default(DEFAULT_LIMITS.retry_ratio),
  /** ...plus this many, however few requests there were. */
  retry_floor: z.int().min(0).max(100_000).default(DEFAULT_LIMITS.retry_floor),
});

/** Batching: global settings plus overrides for a region, a model, or both (later wins). */
export const BatchingConfigSchema = z.strictObject({
  ...BATCHING_FIELDS,
  overrides: z
    .array(z.strictObject({ region: id.optional(), model: id.optional(), ...BATCHING_FIELDS }))
    .default([]),
});

/** The whole `WARMGATE_CONFIG` document, with the cross-references checked. */
export const GatewayConfigSchema = z
  .strictObject({
    models: z.array(ModelConfigSchema).min(1),
    /** In fallback order after the caller's nearest region. */
    regions: z.array(RegionConfigSchema).min(1),
    default_region: id,
    /** Names (`fast`, `cheap`, …) for ordered lists of models: the next one serves when one has no healthy origin. */
    aliases: AliasesSchema.default({}),
    limits: LimitsConfigSchema.default(LimitsConfigSchema.parse({})),
    batching: BatchingConfigSchema.default(BatchingConfigSchema.parse({})),
    /** Circuit breakers of the origins (docs/failover.md). */
    breakers: BreakersConfigSchema.optional(),
    /** Canary rollouts, at most one per model (docs/failover.md, "Canaries"). */
    canaries: z.array(CanaryConfigSchema).default([]),
    /** Routing to warm prefix caches (docs/routing.md). */
    routing: RoutingConfigSchema.optional(),
  })
  .superRefine((config, ctx) => {
    const modelIds = new Set<string>();
    config.models.forEach((model, i) => {
      if (modelIds.has(model.id)) {
        ctx.addIssue({ code: "custom", path: ["models", i, "id"], message: "duplicate model id" });
      }
      modelIds.add(model.id);
    });
    config.models.forEach((model, i) => {
      model.aliases.forEach((alias, j) => {
        if (modelIds.has(alias)) {
          ctx.addIssue({
            code: "custom",
            path: ["models", i, "aliases", j],
            message: `alias "${alias}" is also a model id`,
          });
        }
      });
    });
    for (const issue of aliasIssues(config)) ctx.addIssue({ code: "custom", ...issue });
    const regionIds = new Set<string>();
    const originIds = new Set<string>();
    config.regions.forEach((region, i) => {
      if (regionIds.has(region.id)) {
        ctx.addIssue({
          code: "custom",
          path: ["regions", i, "id"],
          message: "duplicate region id",
        });
      }
      regionIds.add(region.id);
      if (routingEnabled(config.routing) && region.origins.length > MAX_ROUTED_ORIGINS) {
        ctx.addIssue({
          code: "custom",
          path: ["regions", i, "origins"],
          message: `routing follows at most ${MAX_ROUTED_ORIGINS} origins per region; split the region or set routing.enabled to false`,
        });
      }
      region.origins.forEach((origin, j) => {
        if (originIds.has(origin.id)) {
          ctx.addIssue({
            code: "custom",
            path: ["regions", i, "origins", j, "id"],
            message: "duplicate origin id",
          });
        }
        originIds.add(origin.id);
        origin.models?.forEach((model, k) => {
          if (!modelIds.has(model)) {
            ctx.addIssue({
              code: "custom",
              path: ["regions", i, "origins", j, "models", k],
              message: `unknown model "${model}"`,
            });
          }
        });
      });
    });
    config.batching.overrides.forEach((override, i) => {
      if (override.region !== undefined && !regionIds.has(override.region)) {
        ctx.addIssue({
          code: "custom",
          path: ["batching", "overrides", i, "region"],
          message: `unknown region "${override.region}"`,
        });
      }
      if (override.model !== undefined && !modelIds.has(override.model)) {
        ctx.addIssue({
          code: "custom",
          path: ["batching", "overrides", i, "model"],
          message: `unknown model "${override.model}"`,
        });
      }
    });
    const canaried = new Set<string>();
    config.canaries.forEach((canary, i) => {
      if (!modelIds.has(canary.model) || canaried.has(canary.model)) {
        ctx.addIssue({
          code: "custom",
          path: ["canaries", i, "model"],
          message: canaried.has(canary.model)
            ? `a second canary for "${canary.model}"`
            : `unknown model "${canary.model}"`,
        });
      }
      canaried.add(canary.model);
      canary.origins.forEach((origin, j) => {
        if (!originIds.has(origin)) {
          ctx.addIssue({
            code: "custom",
            path: ["canaries", i, "origins", j],
            message: `unknown origin "${origin}"`,
          });
        }
      });
    });
    if (!regionIds.has(config.default_region)) {
      ctx.addIssue({
        code: "custom",
        path: ["default_region"],
        message: `unknown region "${config.default_region}"`,
      });
    }
  });

/** A validated gateway configuration. */
export type GatewayConfig = z.output<typeof GatewayConfigSchema>;
/** A configured model. */
export type ModelConfig = GatewayConfig["models"][number];
/** A configured region. */
export type RegionConfig = GatewayConfig["regions"][number];
/** A configured origin. */
export type OriginConfig = RegionConfig["origins"][number];
/** Request limits after defaults. */
export type LimitsConfig = GatewayConfig["limits"];
/** Batching settings as validated (unset fields take the batcher's defaults). */
export type BatchingConfig = GatewayConfig["batching"];
/** What operators write (defaults may be left out); used by tools that generate config. */
export type GatewayConfigInput = z.input<typeof GatewayConfigSchema>;

/** The configuration could not be used; `field` names the first bad field (`regions[0].id`). */
export class ConfigError extends Error {
  override name = "ConfigError";
  readonly field: string | null;

  constructor(message: string, field: string | null) {
    super(message);
    this.field = field;
  }
}

/** Formats a zod path the way OpenAI names params: `regions[0].origins[1].url`. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out;
}

/** Parses and validates config text; throws {@link ConfigError} naming the bad field. */
export function parseGatewayConfig(text: string | undefined): GatewayConfig {
  if (text === undefined || text.trim() === "") {
    throw new ConfigError("WARMGATE_CONFIG is not set", "WARMGATE_CONFIG");
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    const detail = error instanceof Error ? error.message : String(error);
    throw new ConfigError(`WARMGATE_CONFIG is not valid JSON: ${detail}`, "WARMGATE_CONFIG");
  }
  const result = GatewayConfigSchema.safeParse(json);
  if (!result.success) {
    const issue = result.error.issues[0];
    const field = issue ? formatPath(issue.path) : "";
    const where = field === "" ? "" : ` at ${field}`;
    throw new ConfigError(
      `WARMGATE_CONFIG is invalid${where}: ${issue?.message ?? "unknown problem"}`,
      field === "" ? null : field,
    );
  }
  return result.data;
}

let cachedText: string | undefined;
let cachedResult:
  | { ok: true; config: GatewayConfig }
  | { ok: false; error: ConfigError }
  | undefined;

/**
 * Parses once per isolate and caches by text, so the hot path pays a string comparison.
 * A bad config is cached too: every request fails the same way without re-parsing.
 */
export function loadGatewayConfig(text: string | undefined): GatewayConfig {
  if (cachedResult === undefined || cachedText !== text) {
    cachedText = text;
    try {
      cachedResult = { ok: true, config: parseGatewayConfig(text) };
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      cachedResult = { ok: false, error };
    }
  }
  if (!cachedResult.ok) throw cachedResult.error;
  return cachedResult.config;
}

/** The models an origin serves. */
export function originServes(origin: OriginConfig, model: string): boolean {
  return origin.models === undefined || origin.models.includes(model);
}

/** Resolves a requested model name (id or alias) to its configured model, or undefined. */
export function resolveModel(config: GatewayConfig, name: string): ModelConfig | undefined {
  return resolveModels(config, name)[0];
}

/**
 * The models a requested name stands for, in the order to try them: a model id, an alias
 * of `aliases` (its list), or a model's own alias; empty when the name is unknown.
 */
export function resolveModels(config: GatewayConfig, name: string): ModelConfig[] {
  const model = config.models.find((m) => m.id === name);
  if (model !== undefined) return [model];
  const list = config.aliases[name];
  if (list !== undefined) {
    return list.flatMap((listed) => config.models.filter((m) => m.id === listed));
  }
  const owner = config.models.find((m) => m.aliases.includes(name));
  return owner === undefined ? [] : [owner];
}
