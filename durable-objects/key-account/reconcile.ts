/**
 * Where a key's account asks how its lapsed requests ended (docs/key-account.md, "Leases
 * and reconciliation"): every origin of the configuration, which remember each item they
 * ran (`POST /v1/batch/outcomes`); the lookup and the billing rule are in
 * `contracts/outcomes.ts`, shared with the edge.
 */
import type { OutcomeSource } from "../../contracts/outcomes.ts";

/**
 * The origins of a `WARMGATE_CONFIG` document (already validated by the edge at start-up):
 * only their ids and URLs, read defensively.
 */
export function outcomeSources(configText: string | undefined): OutcomeSource[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(configText ?? "");
  } catch {
    return [];
  }
  const regions = (parsed as { regions?: unknown }).regions;
  if (!Array.isArray(regions)) return [];
  const sources = new Map<string, OutcomeSource>();
  for (const region of regions as { origins?: unknown }[]) {
    if (!Array.isArray(region.origins)) continue;
    for (const origin of region.origins as {
      id?: unknown;
      url?: unknown;
      credentials?: unknown;
    }[]) {
      if (typeof origin.id !== "string" || typeof origin.url !== "string") continue;
      const names = Array.isArray(origin.credentials)
        ? origin.credentials.filter((name): name is string => typeof name === "string")
        : undefined;
      sources.set(origin.url, {
        id: origin.id,
        url: origin.url.replace(/\/+$/, ""),
        ...(names !== undefined && { credentials: names }),
      });
    }
  }
  return [...sources.values()];
}
