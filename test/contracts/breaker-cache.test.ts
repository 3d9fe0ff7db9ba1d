import { describe, expect, it } from "vitest";
import type { BreakerRegion, BreakerView } from "../../contracts/breaker.ts";
import { DEFAULT_BREAKER_SETTINGS } from "../../contracts/config/breakers.ts";
import { BreakerCache } from "../../contracts/breaker-cache.ts";

const region: BreakerRegion = {
  id: "eu",
  origins: [{ id: "eu-1", url: "http://127.0.0.1:1" }],
  settings: DEFAULT_BREAKER_SETTINGS,
};

function view(state: BreakerView["state"]): BreakerView {
  return {
    region: "eu",
    origin: "eu-1",
    state,
    since: 0,
    failures: 0,
    requests: 0,
    opened_count: 0,
    retry_at: null,
    forced: false,
  };
}

/** A cache whose object answers `state`, counting the exchanges. */
function cacheAnswering(state: () => BreakerView["state"]) {
  const calls = { count: 0 };
  const cache = new BreakerCache(() => {
    calls.count++;
    return Promise.resolve([view(state())]);
  });
  return { cache, calls };
}

describe("a copy of a region's breakers", () => {
  it("is refreshed every second while every breaker is closed", async () => {
    const { cache, calls } = cacheAnswering(() => "closed");
    await cache.sync(region, 0);
    expect(cache.sync(region, 300)).toBeNull();
    await cache.sync(region, 1_000);
    expect(calls.count).toBe(2);
  });

  it("is refreshed four times as often while one is half-open, so a close is seen at once", async () => {
    let state: BreakerView["state"] = "half_open";
    const { cache, calls } = cacheAnswering(() => state);
    await cache.sync(region, 0);
    expect(cache.blocked("eu-1")).toBe(true);
    state = "closed";
    await cache.sync(region, 250);
    expect(calls.count).toBe(2);
    expect(cache.blocked("eu-1")).toBe(false);
  });

  it("refreshes on demand, and an object that cannot be reached leaves it as it was", async () => {
    let reachable = true;
    const cache = new BreakerCache(() =>
      reachable ? Promise.resolve([view("open")]) : Promise.reject(new Error("down")),
    );
    await cache.refresh(region, 0);
    expect(cache.blocked("eu-1")).toBe(true);
    reachable = false;
    await cache.refresh(region, 1);
    expect(cache.blocked("eu-1")).toBe(true);
  });
});
