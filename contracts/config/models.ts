/**
 * The models of `WARMGATE_CONFIG`, their prices and the two kinds of alias: a model's own
 * `aliases`, and the top-level `aliases` that name ordered lists of models for fallback
 * (docs/configuration.md, "Models and aliases").
 */
import { z } from "zod";
import { FREE, usdToMicros } from "../pricing.ts";

/** An id of a model, region or origin. */
export const ConfigIdSchema = z.string().min(1).max(128);

const UsdPerMtok = z.number().refine((usd) => usdToMicros(usd) !== null, {
  message: "Expected US dollars per 1M tokens, from 0, with at most six decimal places.",
});

// The schema admits only amounts that usdToMicros accepts.
function micros(usd: number): number {
  return usdToMicros(usd) ?? 0;
}

/** A model's prices in USD per 1M tokens, resolved to exact integer micro-dollars. */
export const ModelPricingSchema = z
  .strictObject({
    input_per_mtok: UsdPerMtok,
    /** Prompt tokens served from the origin's prefix cache; the input price when unset. */
    cached_input_per_mtok: UsdPerMtok.optional(),
    output_per_mtok: UsdPerMtok,
  })
  .transform((pricing) => ({
    inputMicrosPerMtok: micros(pricing.input_per_mtok),
    cachedInputMicrosPerMtok: micros(pricing.cached_input_per_mtok ?? pricing.input_per_mtok),
    outputMicrosPerMtok: micros(pricing.output_per_mtok),
  }));

/** A model the gateway serves, as `GET /v1/models` lists it. */
export const ModelSchema = z
  .strictObject({
    id: ConfigIdSchema,
    /** Context window in tokens, as vLLM reports it. */
    max_model_len: z.int().positive(),
    owned_by: z.string().min(1).default("warmgate"),
    /** Other names that resolve to this model. */
    aliases: z.array(ConfigIdSchema).default([]),
    /** USD per 1M input, cached input and output tokens; a model without prices is free. */
    pricing: ModelPricingSchema.default(FREE),
  })
  .transform((model) => ({
    id: model.id,
    maxModelLen: model.max_model_len,
    ownedBy: model.owned_by,
    aliases: model.aliases,
    price: model.pricing,
  }));

/** A configured model. */
export type ModelConfig = z.output<typeof ModelSchema>;

/** Alias name to the models it stands for, in the order to try them. */
export const AliasesSchema = z.record(ConfigIdSchema, z.array(ConfigIdSchema).min(1).max(16));

/** What resolving a model name reads. */
export interface ModelNames {
  models: readonly ModelConfig[];
  aliases: Readonly<Record<string, readonly string[]>>;
}

/** Resolves a requested model name (id or alias) to its configured model, or undefined. */
export function resolveModel(config: ModelNames, name: string): ModelConfig | undefined {
  return resolveModels(config, name)[0];
}

/**
 * The models a requested name stands for, in the order to try them: a model id, an alias
 * of `aliases` (its list), or a model's own alias; empty when the name is unknown.
 */
export function resolveModels(config: ModelNames, name: string): ModelConfig[] {
  const model = config.models.find((m) => m.id === name);
  if (model !== undefined) return [model];
  const list = config.aliases[name];
  if (list !== undefined) {
    return list.flatMap((listed) => config.models.filter((m) => m.id === listed));
  }
  const owner = config.models.find((m) => m.aliases.includes(name));
  return owner === undefined ? [] : [owner];
}
