/**
 * What the fleet is doing, gathered when `/metrics` or the dashboard asks (docs/metrics.md)
 * from the Durable Objects that own the figures: every key's account (requests, latency,
 * spend, errors), every team's (its alerts), every Batcher (batches, queues, load reports,
 * routing), the breakers and the answer tallies. A scrape costs a call per key, per team,
 * per Batcher and per tally shard; a request costs nothing more.
 */
import type { BreakerView } from "../../contracts/breaker.ts";
import type { BatcherSnapshot } from "../../durable-objects/batcher/types.ts";
import type { KeyMetrics } from "../../durable-objects/key-account/metrics.ts";
import { breakerRegion } from "../health/breakers.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import { batchingPlan } from "../../contracts/config/plans.ts";
import { originServes } from "../../contracts/config/regions.ts";
import { batcherName } from "../delivery/batcher-plan.ts";
import { shardsView } from "../delivery/shard-count.ts";
import { keyAccount, keyDirectory } from "../accounts/account-client.ts";
import { teamAccount } from "../accounts/teams.ts";
import type { TeamMetrics } from "../../durable-objects/team-account/types.ts";
import type { AnswerBatch } from "../../durable-objects/answer-tally/types.ts";
import type { AnswerCounts } from "./answer-counts.ts";

/** Keys read per directory page. */
const PAGE = 100;
/** Most keys one collection reads (a hundred pages). */
export const MAX_COLLECTED_KEYS = 10_000;

/** One Batcher's snapshot, with where it works. */
export interface BatcherStats {
  region: string;
  model: string;
  shard: number;
  /** Age past which its origins' load reports are not trusted (`batching.load_report_ttl_ms`). */
  reportTtlMs: number;
  snapshot: BatcherSnapshot;
}

/** Everything one collection gathered. */
export interface FleetStats {
  at: number;
  keys: KeyMetrics[];
  /** Whether more keys exist than {@link MAX_COLLECTED_KEYS}. */
  keysTruncated: boolean;
  /** Teams whose soft budgets have raised alerts, with their counts. */
  teams: TeamMetrics[];
  batchers: BatcherStats[];
  breakers: BreakerView[];
  /** Every answer the edge gave, from the tally objects (this isolate's pushed first). */
  answers: AnswerBatch;
}

async function collectKeys(env: Env): Promise<{ keys: KeyMetrics[]; truncated: boolean }> {
  const ids: string[] = [];
  let after: string | null = null;
  for (;;) {
    const page = await keyDirectory(env).list({ limit: PAGE, after });
    for (const key of page.keys) ids.push(key.id);
    const last = page.keys.at(-1);
    if (!page.hasMore || last === undefined) break;
    if (ids.length >= MAX_COLLECTED_KEYS) return { keys: await read(env, ids), truncated: true };
    after = last.id;
  }
  return { keys: await read(env, ids), truncated: false };
}

async function read(env: Env, ids: readonly string[]): Promise<KeyMetrics[]> {
  const keys = await Promise.all(ids.map((id) => keyAccount(env, id).metrics()));
  return keys.filter((key) => key.series.length > 0 || key.recentErrors.length > 0);
}

// Every team's alert counts (a call per team, as per key); the first MAX_COLLECTED_KEYS teams.
async function collectTeams(env: Env): Promise<TeamMetrics[]> {
  const ids: string[] = [];
  let after: string | null = null;
  while (ids.length < MAX_COLLECTED_KEYS) {
    const page = await keyDirectory(env).teams({ limit: PAGE, after });
    for (const team of page.teams) ids.push(team.id);
    const last = page.teams.at(-1);
    if (!page.hasMore || last === undefined) break;
    after = last.id;
  }
  const teams = await Promise.all(ids.map((id) => teamAccount(env, id).metrics()));
  return teams.filter((team) => team.budgetAlerts.length > 0);
}

async function collectBatchers(env: Env, config: ResolvedConfig): Promise<BatcherStats[]> {
  const wanted: {
    region: string;
    model: string;
    shard: number;
    reportTtlMs: number;
    name: string;
  }[] = [];
  for (const region of config.regions) {
    for (const model of config.models) {
      if (!region.origins.some((origin) => originServes(origin, model.id))) continue;
      const plan = batchingPlan(config, region, model.id);
      if (plan === null || !plan.enabled) continue;
      const count = (await shardsView(env.BATCHER_SHARDS, region.id, model.id, plan))?.count;
      for (let shard = 0; shard < (count ?? plan.shards); shard++) {
        const name = batcherName(region.id, model.id, shard, plan);
        const reportTtlMs = plan.setup.window.loadReportTtlMs;
        wanted.push({ region: region.id, model: model.id, shard, reportTtlMs, name });
      }
    }
  }
  return Promise.all(
    wanted.map(async ({ name, ...where }) => ({
      ...where,
      snapshot: await env.BATCHER.getByName(name).snapshot(),
    })),
  );
}

async function collectBreakers(env: Env, config: ResolvedConfig): Promise<BreakerView[]> {
  const views = await Promise.all(
    config.regions.map((region) =>
      env.ORIGIN_BREAKERS.getByName(region.id).views(breakerRegion(config, region)),
    ),
  );
  return views.flat();
}

/** Upper bounds of the batch-size histogram: the Batcher's power-of-two buckets. */
export const BATCH_SIZE_BOUNDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/** A Batcher's batch sizes (`1`, `2`, `3-4`, `5-8`, …) per bucket of {@link BATCH_SIZE_BOUNDS}. */
export function batchSizeCounts(sizes: Record<string, number>): {
  counts: number[];
  calls: number;
} {
  const counts = BATCH_SIZE_BOUNDS.map(() => 0);
  let calls = 0;
  for (const [bucket, count] of Object.entries(sizes)) {
    const at = BATCH_SIZE_BOUNDS.indexOf(Number(bucket.split("-").at(-1)));
    if (at >= 0) counts[at] = (counts[at] ?? 0) + count;
    calls += count;
  }
  return { counts, calls };
}

/**
 * An origin's load report as shown: its sequences (none once the report is older than
 * `ttlMs`: no call has brought a newer one, so nothing of ours runs there), KV cache in use
 * and the share of prompt tokens its cache served.
 */
export function originShares(
  report: NonNullable<BatcherSnapshot["origins"][string]>,
  ttlMs: number,
): { running: number; waiting: number; kvUsage: number; prefixHit: number | null } {
  const fresh = report.ageMs <= ttlMs;
  return {
    running: fresh ? report.running : 0,
    waiting: fresh ? report.waiting : 0,
    kvUsage: report.kvTotalTokens > 0 ? 1 - report.kvFreeTokens / report.kvTotalTokens : 0,
    prefixHit: report.prefixQueries > 0 ? report.prefixHits / report.prefixQueries : null,
  };
}

/** Gathers the fleet's figures from the objects that own them. */
export async function collectFleet(
  env: Env,
  config: ResolvedConfig,
  answers: AnswerCounts,
): Promise<FleetStats> {
  const [keys, teams, batchers, breakers, answered] = await Promise.all([
    collectKeys(env),
    collectTeams(env),
    collectBatchers(env, config),
    collectBreakers(env, config),
    answers.gather(),
  ]);
  return {
    at: Date.now(),
    keys: keys.keys,
    keysTruncated: keys.truncated,
    teams,
    batchers,
    breakers,
    answers: answered,
  };
}
