/**
 * One Workers Analytics Engine event per settled request, when the `ANALYTICS` binding is
 * configured (docs/metrics.md, "Analytics Engine"): indexed by key id; blobs model,
 * region, status class, tier, outcome, origin; doubles duration ms, TTFT ms (-1 for
 * none), prompt, cached and completion tokens, cost in USD. No key, token or prompt.
 */
import { picosToUsd } from "../../contracts/pricing.ts";
import { statusClassOf } from "../../contracts/prometheus.ts";
import type { SettleMetrics } from "../../durable-objects/key-account/settle-types.ts";
import type { SettledRequest } from "../accounts/settlement.ts";

/** Writes the request's event; does nothing without the binding. */
export function writeRequestEvent(
  dataset: AnalyticsEngineDataset | undefined,
  keyId: string,
  tier: string,
  settled: SettledRequest,
  metrics: SettleMetrics,
  costPicos: bigint,
): void {
  if (dataset === undefined) return;
  const usage = settled.usage;
  dataset.writeDataPoint({
    indexes: [keyId],
    blobs: [
      settled.model ?? "",
      settled.region ?? "none",
      statusClassOf(settled.status),
      tier,
      settled.outcome,
      settled.origin ?? "",
    ],
    doubles: [
      metrics.durationMs,
      metrics.ttftMs ?? -1,
      usage?.prompt_tokens ?? 0,
      usage?.cached_tokens ?? 0,
      usage?.completion_tokens ?? 0,
      picosToUsd(costPicos),
    ],
  });
}
