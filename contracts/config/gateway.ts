/**
 * The whole `WARMGATE_CONFIG` document (docs/configuration.md): one schema per section,
 * the checks across them, and the configuration resolved once as the edge and every
 * Durable Object read it, with what they would otherwise derive per request (batching
 * plans per region and model, each region's breakers) computed when it loads.
 */
import { z } from "zod";
import { formatPath } from "../param-path.ts";
import type { BreakerRegion } from "../breaker.ts";
import { AlertsSchema } from "./alerts.ts";
import { BatchApiSchema } from "./batch-api.ts";
import { BatchingSectionSchema, batchingSettings } from "./batching.ts";
import { BreakersSchema } from "./breakers.ts";
import { CacheSectionSchema } from "./cache.ts";
import { CanarySchema } from "./canaries.ts";
import { checkReferences } from "./checks.ts";
import { LeasesSchema } from "./leases.ts";
import { LimitsSchema } from "./limits.ts";
import { AliasesSchema, ConfigIdSchema, ModelSchema } from "./models.ts";
import { buildPlans } from "./plans.ts";
import { RegionSchema, originServes } from "./regions.ts";
import { RoutingSchema } from "./routing.ts";

/** The document as written, resolved: every default applied, plans built. */
export const GatewayConfigSchema = z
  .strictObject({
    models: z.array(ModelSchema).min(1),
    /** In fallback order after the caller's nearest region. */
    regions: z.array(RegionSchema).min(1),
    /** Nearest region for callers no mapping matches. */
    default_region: ConfigIdSchema,
    /** Names (`fast`, `cheap`, …) for ordered lists of models: the next one serves when one has no healthy origin. */
    aliases: AliasesSchema.default({}),
    limits: LimitsSchema.prefault({}),
    /** Leased allowances of API keys (docs/key-account.md, "Leased allowances"). */
    leases: LeasesSchema.prefault({}),
    /** Micro-batching, with overrides for a region, a model or both (docs/batching.md). */
    batching: BatchingSectionSchema.prefault({}),
    /** Circuit breakers of the origins (docs/failover.md). */
    breakers: BreakersSchema.prefault({}),
    /** Canary rollouts, at most one per model (docs/failover.md, "Canaries"). */
    canaries: z.array(CanarySchema).default([]),
    /** Routing to warm prefix caches (docs/routing.md). */
    routing: RoutingSchema.prefault({}),
    /** The exact response cache, with rules per key and model (docs/cache.md). */
    cache: CacheSectionSchema.prefault({}),
    /** OpenAI's Batch API on the fleet's idle capacity (docs/batch-api.md). */
    batch_api: BatchApiSchema.prefault({}),
    /** Soft-budget alerts (docs/key-account.md, "Soft budgets and alerts"). */
    alerts: AlertsSchema.prefault({}),
  })
  .superRefine(checkReferences)
  .transform((config) => ({
    models: config.models,
    regions: config.regions,
    defaultRegion: config.default_region,
    aliases: config.aliases,
    limits: config.limits,
    leases: config.leases,
    breakers: config.breakers,
    routing: config.routing,
    cache: config.cache,
    batchApi: config.batch_api,
    alerts: config.alerts,
    /** Each model's canary, by model id. */
    canaries: new Map(config.canaries.map((canary) => [canary.model, canary])),
    /** Every region and model's batching plan (see `batchingPlan`). */
    plans: buildPlans({
      regions: config.regions,
      models: config.models,
      settingsOf: (region, model) => batchingSettings(config.batching, region, model),
      breakers: config.breakers,
      routing: config.routing,
    }),
    /** Each region as its breakers know it, by region id. */
    breakerRegions: new Map(
      config.regions.map((region) => [
        region.id,
        {
          id: region.id,
          origins: region.origins.map((origin) => {
            // A model it serves: the probes of its breaker complete one token of it.
            const probeModel = config.models.find((m) => originServes(origin, m.id))?.id;
            return {
              id: origin.id,
              url: origin.url,
              ...(origin.credentials !== undefined && { credentials: origin.credentials }),
              ...(probeModel !== undefined && { probeModel }),
            };
          }),
          settings: config.breakers.settings,
        } satisfies BreakerRegion,
      ]),
    ),
  }));

/** The configuration the edge and the Durable Objects run with. */
export type ResolvedConfig = z.output<typeof GatewayConfigSchema>;

/**
 * The configuration could not be used; `field` names the first bad field (`regions[0].id`),
 * `problems` every one, each a sentence like the message.
 */
export class ConfigError extends Error {
  override name = "ConfigError";
  readonly field: string | null;
  readonly problems: readonly string[];

  constructor(message: string, field: string | null, problems: readonly string[] = [message]) {
    super(message);
    this.field = field;
    this.problems = problems;
  }
}

/** Parses, validates and resolves config text; throws {@link ConfigError} naming the bad field. */
function parseConfig(text: string | undefined): ResolvedConfig {
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
    const problems = result.error.issues.map((issue) => {
      const field = formatPath(issue.path);
      const where = field === "" ? "" : ` at ${field}`;
      return { field, text: `WARMGATE_CONFIG is invalid${where}: ${issue.message}` };
    });
    const first = problems[0] ?? { field: "", text: "WARMGATE_CONFIG is invalid: unknown problem" };
    throw new ConfigError(
      first.text,
      first.field === "" ? null : first.field,
      problems.map((p) => p.text),
    );
  }
  return result.data;
}

let loadedText: string | undefined;
let loaded: { ok: true; config: ResolvedConfig } | { ok: false; error: ConfigError } | undefined;

/**
 * The resolved configuration of `WARMGATE_CONFIG` text; throws {@link ConfigError} naming
 * the bad field. The last text's result is kept, so the hot path pays a string comparison
 * and a bad config fails every request the same way without being parsed again.
 */
export function loadConfig(text: string | undefined): ResolvedConfig {
  if (loaded === undefined || loadedText !== text) {
    loadedText = text;
    try {
      loaded = { ok: true, config: parseConfig(text) };
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      loaded = { ok: false, error };
    }
  }
  if (!loaded.ok) throw loaded.error;
  return loaded.config;
}
