import { describe, expect, it } from "vitest";
import { BATCH_LANE } from "../../../contracts/config/batching.ts";
import { type ResolvedConfig, loadConfig } from "../../../contracts/config/gateway.ts";
import { batchingPlan } from "../../../contracts/config/plans.ts";

const base = {
  models: [
    { id: "m", max_model_len: 1024 },
    { id: "n", max_model_len: 1024 },
  ],
  regions: [
    {
      id: "eu",
      origins: [
        { id: "eu-1", url: "http://eu-1", credentials: ["EU1_TOKEN"] },
        { id: "eu-2", url: "http://eu-2", models: ["n"] },
      ],
    },
    { id: "us", origins: [{ id: "us-1", url: "http://us-1", models: ["n"] }] },
  ],
  default_region: "eu",
};

function resolved(extra: Record<string, unknown> = {}): ResolvedConfig {
  return loadConfig(JSON.stringify({ ...base, ...extra }));
}

function planOf(config: ResolvedConfig, region: string, model: string) {
  const plan = batchingPlan(config, { id: region }, model);
  if (plan === null) throw new Error(`no plan for ${region} and ${model}`);
  return plan;
}

describe("batching plans, resolved when the configuration loads", () => {
  it("applies every default once: the window, the three lanes, shards and timings", () => {
    const plan = planOf(resolved(), "eu", "m");
    expect(plan).toMatchObject({
      enabled: true,
      shards: 1,
      shardBy: "request",
      defaultLane: 1,
      idleBypassMs: 3000,
    });
    expect(plan.setup).toMatchObject({ region: "eu", quarantineMs: 2_000 });
    expect(plan.setup.clientBacklogBytes).toBe(512 * 1024);
    expect(plan.setup.window).toEqual({
      maxBatchSize: 32,
      maxBatchTokens: 65_536,
      maxWindowMs: 10,
      callIntervalMs: 5,
      maxOriginQueue: 8,
      waitShare: 0.1,
      holdShare: 1,
      maxHoldMs: 10,
      holdMinInFlight: 128,
      rateWindowMs: 250,
      loadReportTtlMs: 1000,
      batchMaxLagMs: 20,
      // The three lanes configured by default, then the Batch API's lane below them.
      lanes: [
        { queueTimeoutMs: 30_000, onTimeout: "reject", maxQueue: 1024, refuseStatus: 503 },
        { queueTimeoutMs: 60_000, onTimeout: "reject", maxQueue: 2048, refuseStatus: 503 },
        { queueTimeoutMs: 300_000, onTimeout: "wait", maxQueue: 4096, refuseStatus: 503 },
        BATCH_LANE,
      ],
      batchLane: 3,
      origins: [{ id: "eu-1" }],
    });
  });

  it("has a plan only where an origin of the region serves the model", () => {
    const config = resolved();
    expect(batchingPlan(config, { id: "us" }, "m")).toBeNull();
    expect(planOf(config, "eu", "n").setup.origins).toEqual([
      { id: "eu-1", url: "http://eu-1", credentials: ["EU1_TOKEN"] },
      { id: "eu-2", url: "http://eu-2" },
    ]);
  });

  it("applies matching overrides in order over the section, keeping what they leave out", () => {
    const config = resolved({
      batching: {
        max_window_ms: 3,
        origin_quarantine_ms: 500,
        overrides: [
          { region: "eu", origin_quarantine_ms: 7_000, shards: 2 },
          { model: "n", origin_quarantine_ms: 9_000, enabled: false },
          { region: "us", model: "m", max_window_ms: 1 },
        ],
      },
    });
    expect(planOf(config, "eu", "m")).toMatchObject({ shards: 2, enabled: true });
    expect(planOf(config, "eu", "m").setup).toMatchObject({ quarantineMs: 7_000 });
    expect(planOf(config, "eu", "m").setup.window.maxWindowMs).toBe(3);
    expect(planOf(config, "eu", "n")).toMatchObject({ shards: 2, enabled: false });
    expect(planOf(config, "eu", "n").setup.quarantineMs).toBe(9_000);
    expect(planOf(config, "us", "n").setup.quarantineMs).toBe(9_000);
    expect(planOf(config, "us", "n").shards).toBe(1);
  });

  it("fills each lane written in part, and keeps the default lane within the lanes", () => {
    const config = resolved({ batching: { lanes: [{ max_queue: 5 }], default_lane: 3 } });
    const plan = planOf(config, "eu", "m");
    expect(plan.setup.window.lanes).toEqual([
      { queueTimeoutMs: 30_000, onTimeout: "reject", maxQueue: 5, refuseStatus: 503 },
      BATCH_LANE,
    ]);
    expect(plan.setup.window.batchLane).toBe(1);
    expect(plan.defaultLane).toBe(0);
  });

  it("routes only a region with more than one origin, with the section's settings", () => {
    const config = resolved({ routing: { tie_ms: 50, prefill_tokens_per_s: 2_000 } });
    expect(planOf(config, "eu", "m").setup.routing).toBeNull();
    expect(planOf(config, "eu", "n").setup.routing).toEqual({
      minMatchBlocks: 4,
      spreadRatio: 1,
      spreadMs: 100,
      loadBound: 1.25,
      leftOutShare: 0.5,
      balanceSeqs: 2,
      moveTokensPerSeq: 256,
      evictionWeight: 1,
      tieMs: 50,
      prefillTokensPerMs: 2,
      maxIndexBlocks: 65_536,
    });
    const off = resolved({ routing: { enabled: false } });
    expect(planOf(off, "eu", "n").setup.routing).toBeNull();
  });

  it("gives every plan and every region's breakers the same breaker settings", () => {
    const config = resolved({ breakers: { cooldown_ms: 200_000, probes: 3 } });
    const settings = {
      consecutiveFailures: 5,
      failureRatio: 0.5,
      minRequests: 20,
      windowMs: 10_000,
      slowFirstByteMs: 2_000,
      cooldownMs: 200_000,
      // Never below the first cooldown.
      maxCooldownMs: 200_000,
      probes: 3,
      maxEjectionShare: 0.5,
    };
    expect(config.breakers).toEqual({ enabled: true, settings });
    expect(planOf(config, "us", "n").setup.breakers).toEqual({ enabled: true, settings });
    expect(config.breakerRegions.get("eu")).toEqual({
      id: "eu",
      origins: [
        { id: "eu-1", url: "http://eu-1", credentials: ["EU1_TOKEN"], probeModel: "m" },
        { id: "eu-2", url: "http://eu-2", probeModel: "n" },
      ],
      settings,
    });
  });

  it("names a Batcher by a hash of its setup: the same setup, the same name", () => {
    const one = planOf(resolved(), "eu", "n").setup.version;
    expect(one).toMatch(/^[0-9a-f]{8}$/);
    expect(planOf(resolved({ limits: { retry_budget: 0 } }), "eu", "n").setup.version).toBe(one);
    expect(planOf(resolved({ batching: { max_hold_ms: 1 } }), "eu", "n").setup.version).not.toBe(
      one,
    );
  });

  it("resolves each model's canary, defaults applied", () => {
    const config = resolved({ canaries: [{ model: "n", origins: ["eu-2"], weight: 0.1 }] });
    expect([...config.canaries.values()]).toEqual([
      {
        model: "n",
        origins: ["eu-2"],
        weight: 0.1,
        minRequests: 50,
        maxErrorRateIncrease: 0.05,
        maxTtftP95Ratio: 1.5,
      },
    ]);
    expect(config.canaries.get("m")).toBeUndefined();
  });
});
