/**
 * Lines an earlier incarnation left running whose answer an origin already holds
 * (docs/batch-api.md, "Lines"): the region's origins are asked how those lines' items
 * ended, and a line that ended `ok` on one goes back to that origin alone, which answers
 * it from the answer it kept (origin/PROTOCOL.md, "Background items") instead of running
 * it again.
 */
import { lookupOutcomes } from "../../contracts/outcomes.ts";
import { MAX_OUTCOME_IDS } from "../../contracts/protocol/schema.ts";
import type { BatchRunPlan } from "./types.ts";

/**
 * For each line (item id to line index) that ended `ok` on one of the region's origins,
 * the others, which its next attempt avoids. An origin that does not answer holds none.
 */
export async function keptAnswers(
  run: Pick<BatchRunPlan, "setup">,
  lines: ReadonlyMap<string, number>,
  secrets: object,
): Promise<Map<number, string[]>> {
  const origins = run.setup.origins;
  const sources = origins.map((origin) => ({
    id: origin.id,
    url: origin.url.replace(/\/+$/, ""),
    ...(origin.credentials !== undefined && { credentials: origin.credentials }),
  }));
  const avoid = new Map<number, string[]>();
  const ids = [...lines.keys()];
  for (let at = 0; at < ids.length; at += MAX_OUTCOME_IDS) {
    const query = { ids: ids.slice(at, at + MAX_OUTCOME_IDS) };
    const { items } = await lookupOutcomes(sources, query, secrets);
    for (const item of items) {
      if (item.state !== "ended" || item.outcome !== "ok") continue;
      const idx = lines.get(item.id);
      if (idx === undefined || avoid.has(idx)) continue;
      avoid.set(
        idx,
        origins.filter((origin) => origin.id !== item.origin).map((origin) => origin.id),
      );
    }
  }
  return avoid;
}
