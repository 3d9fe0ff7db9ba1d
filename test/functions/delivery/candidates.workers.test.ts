import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { ApiError } from "../../../contracts/errors.ts";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { OriginHealth } from "../../../contracts/origin-health.ts";
import { dispatchCompletion } from "../../../functions/delivery/failover.ts";
import type { DispatchAttempt } from "../../../functions/delivery/opener.ts";
import { OriginPool } from "../../../functions/delivery/origin-pool.ts";

// The candidates left are re-ranked before each retry (docs/failover.md, "Failover"): an
// origin whose breaker opened meanwhile is out, and a request may find none left.
const config = loadConfig(
  JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
    regions: [
      { id: "near", origins: [{ id: "near-1", url: "http://127.0.0.1:9" }] },
      { id: "far", origins: [{ id: "far-1", url: "http://127.0.0.1:9" }] },
    ],
    default_region: "near",
    limits: { retry_budget: 2 },
  }),
);

/** Dispatches a request whose every attempt fails, the breakers opening after the first. */
async function dispatchWhileBreakersOpen() {
  const open = new Set<string>();
  const pool = new OriginPool(new OriginHealth(0, { blocked: (id) => open.has(id) }));
  const tried: string[] = [];
  const candidates = config.regions.flatMap((region) =>
    region.origins.map((origin) => ({ region, origin })),
  );
  const result = dispatchCompletion({
    requestId: `req_${crypto.randomUUID().replaceAll("-", "")}`,
    path: "/v1/chat/completions",
    body: "{}",
    model: "warmgate-sim-8b",
    candidates,
    pool,
    limits: config.limits,
    delivery: "whole",
    headers: {},
    secrets: env,
    gaveUp: [],
    onSettled: () => {},
    open: async (candidate): Promise<DispatchAttempt> => {
      tried.push(candidate.origin.id);
      // Every breaker of the model opens while the first attempt fails.
      for (const c of candidates) open.add(c.origin.id);
      return { kind: "failed", failure: "unavailable", detail: "refused", originId: null };
    },
  });
  return {
    error: await result.then(
      () => null,
      (error: unknown) => error,
    ),
    tried,
  };
}

describe("a request whose every candidate left went behind an open breaker", () => {
  it("stops trying and answers the origins' failure, an OpenAI error, not a crash", async () => {
    const { error, tried } = await dispatchWhileBreakersOpen();
    expect(tried).toEqual(["near-1"]);
    expect(error).toBeInstanceOf(ApiError);
    expect((error as ApiError).status).toBe(503);
  });
});

describe("an attempt its region's Batcher ran on another origin than planned", () => {
  it("leaves the origin planned to be tried next, before another region", async () => {
    const twoNear = loadConfig(
      JSON.stringify({
        models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
        regions: [
          {
            id: "near",
            origins: [
              { id: "near-1", url: "http://127.0.0.1:9" },
              { id: "near-2", url: "http://127.0.0.1:9" },
            ],
          },
          { id: "far", origins: [{ id: "far-1", url: "http://127.0.0.1:9" }] },
        ],
        default_region: "near",
        limits: { retry_budget: 2 },
      }),
    );
    const candidates = twoNear.regions.flatMap((region) =>
      region.origins.map((origin) => ({ region, origin })),
    );
    // Planned, and where each attempt ran: the first, planned near-1, ran on near-2.
    const tried: [string, string][] = [];
    const error = await dispatchCompletion({
      requestId: `req_${crypto.randomUUID().replaceAll("-", "")}`,
      path: "/v1/chat/completions",
      body: "{}",
      model: "warmgate-sim-8b",
      candidates,
      pool: new OriginPool(new OriginHealth(10_000)),
      limits: twoNear.limits,
      delivery: "whole",
      headers: {},
      secrets: env,
      gaveUp: [],
      onSettled: () => {},
      open: async (candidate, call): Promise<DispatchAttempt> => {
        const ran =
          tried.length === 0
            ? "near-2"
            : candidate.region.origins.find((o) => !call.avoidOrigins.includes(o.id))?.id;
        tried.push([candidate.origin.id, ran ?? "none"]);
        return {
          kind: "failed",
          failure: "timeout",
          detail: "no first byte",
          originId: ran ?? null,
        };
      },
    }).then(
      () => null,
      (failure: unknown) => failure,
    );
    expect(tried).toEqual([
      ["near-1", "near-2"],
      ["near-1", "near-1"],
      ["far-1", "far-1"],
    ]);
    expect(error).toBeInstanceOf(ApiError);
  });
});
