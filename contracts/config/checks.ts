/**
 * The checks of `WARMGATE_CONFIG` that span sections (docs/configuration.md): ids are
 * unique, every reference names something configured, aliases shadow nothing, and routing
 * follows no more origins than its index can. Each problem names the field at fault.
 */
import type { z } from "zod";
import type { BatchingSection } from "./batching.ts";
import type { CacheSection } from "./cache.ts";
import type { CanarySpec } from "./canaries.ts";
import type { ModelConfig } from "./models.ts";
import type { RegionConfig } from "./regions.ts";
import { MAX_ROUTED_ORIGINS } from "./routing.ts";

/** The sections the checks read, validated one by one. */
export interface CheckedSections {
  models: readonly ModelConfig[];
  regions: readonly RegionConfig[];
  default_region: string;
  aliases: Readonly<Record<string, readonly string[]>>;
  batching: BatchingSection;
  canaries: readonly CanarySpec[];
  routing: { enabled: boolean };
  cache?: CacheSection;
}

/** A problem at a field's path. */
interface Issue {
  path: (string | number)[];
  message: string;
}

/** Adds an issue for every cross-reference that does not hold. */
export function checkReferences(config: CheckedSections, ctx: z.RefinementCtx): void {
  for (const issue of [
    ...modelIssues(config),
    ...aliasIssues(config),
    ...regionIssues(config),
    ...overrideIssues(config),
    ...canaryIssues(config),
    ...cacheIssues(config),
  ]) {
    ctx.addIssue({ code: "custom", ...issue });
  }
  if (!config.regions.some((region) => region.id === config.default_region)) {
    ctx.addIssue({
      code: "custom",
      path: ["default_region"],
      message: `unknown region "${config.default_region}"`,
    });
  }
}

function modelIssues(config: CheckedSections): Issue[] {
  const issues: Issue[] = [];
  const modelIds = new Set<string>();
  config.models.forEach((model, i) => {
    if (modelIds.has(model.id))
      issues.push({ path: ["models", i, "id"], message: "duplicate model id" });
    modelIds.add(model.id);
  });
  config.models.forEach((model, i) => {
    model.aliases.forEach((alias, j) => {
      if (modelIds.has(alias)) {
        issues.push({
          path: ["models", i, "aliases", j],
          message: `alias "${alias}" is also a model id`,
        });
      }
    });
  });
  return issues;
}

/**
 * The top-level aliases: an alias is not a model id nor another model's own alias, and
 * lists only configured models, each once.
 */
function aliasIssues(config: CheckedSections): Issue[] {
  const issues: Issue[] = [];
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

function regionIssues(config: CheckedSections): Issue[] {
  const issues: Issue[] = [];
  const modelIds = new Set(config.models.map((model) => model.id));
  const regionIds = new Set<string>();
  const originIds = new Set<string>();
  config.regions.forEach((region, i) => {
    if (regionIds.has(region.id))
      issues.push({ path: ["regions", i, "id"], message: "duplicate region id" });
    regionIds.add(region.id);
    if (config.routing.enabled && region.origins.length > MAX_ROUTED_ORIGINS) {
      issues.push({
        path: ["regions", i, "origins"],
        message: `routing follows at most ${MAX_ROUTED_ORIGINS} origins per region; split the region or set routing.enabled to false`,
      });
    }
    region.origins.forEach((origin, j) => {
      if (originIds.has(origin.id)) {
        issues.push({ path: ["regions", i, "origins", j, "id"], message: "duplicate origin id" });
      }
      originIds.add(origin.id);
      origin.models?.forEach((model, k) => {
        if (!modelIds.has(model)) {
          issues.push({
            path: ["regions", i, "origins", j, "models", k],
            message: `unknown model "${model}"`,
          });
        }
      });
    });
  });
  return issues;
}

function overrideIssues(config: CheckedSections): Issue[] {
  const issues: Issue[] = [];
  const modelIds = new Set(config.models.map((model) => model.id));
  const regionIds = new Set(config.regions.map((region) => region.id));
  config.batching.overrides.forEach((override, i) => {
    if (override.region !== undefined && !regionIds.has(override.region)) {
      issues.push({
        path: ["batching", "overrides", i, "region"],
        message: `unknown region "${override.region}"`,
      });
    }
    if (override.model !== undefined && !modelIds.has(override.model)) {
      issues.push({
        path: ["batching", "overrides", i, "model"],
        message: `unknown model "${override.model}"`,
      });
    }
  });
  return issues;
}

function canaryIssues(config: CheckedSections): Issue[] {
  const issues: Issue[] = [];
  const modelIds = new Set(config.models.map((model) => model.id));
  const originIds = new Set(config.regions.flatMap((region) => region.origins.map((o) => o.id)));
  const canaried = new Set<string>();
  config.canaries.forEach((canary, i) => {
    if (!modelIds.has(canary.model) || canaried.has(canary.model)) {
      issues.push({
        path: ["canaries", i, "model"],
        message: canaried.has(canary.model)
          ? `a second canary for "${canary.model}"`
          : `unknown model "${canary.model}"`,
      });
    }
    canaried.add(canary.model);
    canary.origins.forEach((origin, j) => {
      if (!originIds.has(origin)) {
        issues.push({ path: ["canaries", i, "origins", j], message: `unknown origin "${origin}"` });
      }
    });
  });
  return issues;
}

// A rule is matched against the served model's id: an alias or unknown name would never apply.
function cacheIssues(config: CheckedSections): Issue[] {
  const ids = new Set(config.models.map((model) => model.id));
  return (config.cache?.rules ?? []).flatMap((rule, i) =>
    rule.model === undefined || ids.has(rule.model)
      ? []
      : [{ path: ["cache", "rules", i, "model"], message: `unknown model "${rule.model}"` }],
  );
}
