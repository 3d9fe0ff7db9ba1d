/**
 * Prices and aliases in the gateway configuration: each model's price table (USD per 1M
 * input, cached input and output tokens) and aliases that name ordered lists of models
 * (`fast`, `cheap`, `best`, …). Validated with zod; costs are computed in exact integers
 * by the pricing core (`contracts/pricing.ts`).
 * See docs/edge.md, "Pricing".
 */
import { z } from "zod";
import { FREE, type ModelPrice, microsToUsd, usdToMicros } from "../contracts/pricing.ts";

const UsdPerMtok = z.number().refine((usd) => usdToMicros(usd) !== null, {
  message: "Expected US dollars per 1M tokens, from 0, with at most six decimal places.",
});

/** A model's prices in USD per 1M tokens; cached input tokens default to the input price. */
export const ModelPricingSchema = z.strictObject({
  input_per_mtok: UsdPerMtok,
  /** Prompt tokens served from the origin's prefix cache. */
  cached_input_per_mtok: UsdPerMtok.optional(),
  output_per_mtok: UsdPerMtok,
});

/** A model's configured prices. */
export type ModelPricing = z.infer<typeof ModelPricingSchema>;

/** Alias name to the models it stands for, in the order to try them. */
export const AliasesSchema = z.record(
  z.string().min(1).max(128),
  z.array(z.string().min(1).max(128)).min(1).max(16),
);

/** The `pricing` object of a model in `GET /v1/models`, in USD per 1M tokens. */
export interface PricingJson {
  input_per_mtok: number;
  cached_input_per_mtok: number;
  output_per_mtok: number;
}

/** A model's prices as exact integers (micro-dollars per 1M tokens); free when it has none. */
export function modelPrice(pricing: ModelPricing | undefined): ModelPrice {
  if (pricing === undefined) return FREE;
  return {
    inputMicrosPerMtok: micros(pricing.input_per_mtok),
    cachedInputMicrosPerMtok: micros(pricing.cached_input_per_mtok ?? pricing.input_per_mtok),
    outputMicrosPerMtok: micros(pricing.output_per_mtok),
  };
}

// The schema admits only amounts that usdToMicros accepts.
function micros(usd: number): number {
  return usdToMicros(usd) ?? 0;
}

/** A model's prices for `GET /v1/models`. */
export function pricingJson(pricing: ModelPricing | undefined): PricingJson {
  const price = modelPrice(pricing);
  return {
    input_per_mtok: microsToUsd(price.inputMicrosPerMtok),
    cached_input_per_mtok: microsToUsd(price.cachedInputMicrosPerMtok),
    output_per_mtok: microsToUsd(price.outputMicrosPerMtok),
  };
}

/** A problem with the aliases of a configuration, at its zod path. */
export interface AliasIssue {
  path: (string | number)[];
  message: string;
}

/**
 * Checks aliases against the models: an alias is not a model id nor another model's own
 * alias, and lists only configured models, each once.
 */
export function aliasIssues(config: {
  models: readonly { id: string; aliases: readonly string[] }[];
  aliases: Readonly<Record<string, readonly string[]>>;
}): AliasIssue[] {
  const issues: AliasIssue[] = [];
  const modelIds = new Set(config.models.map((model) => model.id));
  const ownAliases = new Set(config.models.flatMap((model) => model.aliases));
  for (const [alias, models] of Object.entries(config.aliases)) {
    if (modelIds.has(alias)) {
      issues.push({ path: ["aliases", alias], message: `alias "${alias}" is also a model id` });
    }
    if (ownAliases.has(alias)) {
      issues.push({
        path: ["aliases", alias],
        message: `alias "${alias}" is also listed in a model's aliases`,
      });
    }
    models.forEach((model, i) => {
      if (!modelIds.has(model)) {
        issues.push({ path: ["aliases", alias, i], message: `unknown model "${model}"` });
      } else if (models.indexOf(model) !== i) {
        issues.push({ path: ["aliases", alias, i], message: `model "${model}" is listed twice` });
      }
    });
  }
  return issues;
}
