/**
 * `GET /admin/batchers/:region/:model`: what each batcher of a region and model is doing
 * (queue, window, calls in flight, counters, recent calls), for operators and benchmarks.
 * Behind the admin token.
 * See docs/batching.md, "Snapshot".
 */
import { Hono } from "hono";
import { adminAuth } from "../admin.ts";
import type { AppEnv } from "../app-env.ts";
import { batcherName, batchingPlan } from "../delivery/batcher-plan.ts";
import { ApiError } from "../../contracts/errors.ts";

/** The batcher inspection route group, mounted at `/admin/batchers`. */
export const batchers = new Hono<AppEnv>()
  .use("*", adminAuth())
  .get("/:region/:model", async (c) => {
    const { region: regionId, model } = c.req.param();
    const region = c.var.config.regions.find((r) => r.id === regionId);
    const known = c.var.config.models.some((m) => m.id === model);
    const plan = region === undefined || !known ? null : batchingPlan(c.var.config, region, model);
    if (plan === null) {
      throw new ApiError(404, `No batcher serves model '${model}' in region '${regionId}'.`, {
        type: "invalid_request_error",
        code: "batcher_not_found",
      });
    }
    const shards = await Promise.all(
      Array.from({ length: plan.shards }, async (_, shard) => {
        const name = batcherName(regionId, model, shard, plan);
        return { name, ...(await c.env.BATCHER.getByName(name).snapshot()) };
      }),
    );
    return c.json({ region: regionId, model, enabled: plan.enabled, shards });
  });
