/**
 * `GET /admin/batchers/:region/:model`: what each batcher of a region and model is doing
 * (queue, window, calls in flight, counters, recent calls) and the router's index over all
 * its shards (blocks per origin, hit rate predicted and reported, placements by reason),
 * and how many shards run now (`scaling`), for operators and benchmarks. Behind the admin token.
 * See docs/batching.md, "Snapshot", and docs/routing.md, "The index".
 */
import { Hono } from "hono";
import { adminAuth } from "../../middleware/admin-auth.ts";
import type { AppEnv } from "../../app-env.ts";
import { batchingPlan } from "../../../contracts/config/plans.ts";
import { batcherName } from "../../delivery/batcher-plan.ts";
import { shardsView } from "../../delivery/shard-count.ts";
import { notFound } from "../../../contracts/errors.ts";
import type { RouterView } from "../../../durable-objects/batcher/routing/router.ts";
import { methodNotAllowed } from "../../error-handler.ts";

/** The batcher inspection route group, mounted at `/admin/batchers`. */
export const batchers = new Hono<AppEnv>()
  .use("*", adminAuth())
  .get("/:region/:model", async (c) => {
    const { region: regionId, model } = c.req.param();
    const region = c.var.config.regions.find((r) => r.id === regionId);
    const known = c.var.config.models.some((m) => m.id === model);
    const plan = region === undefined || !known ? null : batchingPlan(c.var.config, region, model);
    if (plan === null) {
      throw notFound(
        `No batcher serves model '${model}' in region '${regionId}'.`,
        "batcher_not_found",
      );
    }
    // As many shards as run now, and each one's last load report (docs/batching.md, "Shards").
    const scaling = await shardsView(c.env.BATCHER_SHARDS, regionId, model, plan);
    const shards = await Promise.all(
      Array.from({ length: scaling?.count ?? plan.shards }, async (_, shard) => {
        const name = batcherName(regionId, model, shard, plan);
        return { name, ...(await c.env.BATCHER.getByName(name).snapshot()) };
      }),
    );
    const routing = plan.setup.routing === null ? null : mergeViews(shards.map((s) => s.routing));
    return c.json({ region: regionId, model, enabled: plan.enabled, scaling, routing, shards });
  })
  .all("/:region/:model", methodNotAllowed(["GET", "HEAD"]));

/** The shards' router views as one: counts summed, hit rates weighted by requests. */
function mergeViews(views: readonly (RouterView | null)[]): RouterView | null {
  let merged: RouterView | null = null;
  for (const view of views) {
    if (view === null) continue;
    if (merged === null) {
      merged = structuredClone(view);
      continue;
    }
    for (const [id, origin] of Object.entries(view.origins)) {
      const into = (merged.origins[id] ??= { blocks: 0, capacity_blocks: 0, placements: 0 });
      into.blocks += origin.blocks;
      into.capacity_blocks += origin.capacity_blocks;
      into.placements += origin.placements;
    }
    for (const [reason, count] of Object.entries(view.placements)) {
      merged.placements[reason as keyof RouterView["placements"]] += count;
    }
    const a = merged.hit_rate;
    const b = view.hit_rate;
    const requests = a.requests + b.requests;
    const weigh = (x: number | null, y: number | null) =>
      x === null ? y : y === null ? x : (x * a.requests + y * b.requests) / requests;
    merged.hit_rate = {
      predicted: weigh(a.predicted, b.predicted),
      reported: weigh(a.reported, b.reported),
      requests,
    };
    merged.sessions += view.sessions;
  }
  return merged;
}
