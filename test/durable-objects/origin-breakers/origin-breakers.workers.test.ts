import { env } from "cloudflare:workers";
import { evictDurableObject, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import type { BreakerRegion } from "../../../contracts/breaker.ts";
import { DEFAULT_BREAKER_SETTINGS } from "../../../contracts/config/breakers.ts";
import type { OriginBreakers } from "../../../durable-objects/origin-breakers/index.ts";
import { originUrl } from "../../support/test-origins.workers.ts";

// us-1 is a healthy shared origin: the probes here only read it.
function regionOf(tag: string): BreakerRegion {
  return {
    id: `restart-${tag}`,
    origins: [
      { id: `a@${tag}`, url: originUrl("us-1"), probeModel: "warmgate-sim-8b" },
      { id: `b@${tag}`, url: originUrl("us-1") },
    ],
    settings: { ...DEFAULT_BREAKER_SETTINGS, consecutiveFailures: 2, cooldownMs: 100, probes: 2 },
  };
}

const failures = (origin: string) => ({ origin, requests: 2, failures: 2, trailing: 2 });

/** The breaker's row as kept in SQLite, read without any call that would refresh it. */
async function keptState(stub: DurableObjectStub, origin: string) {
  return runInDurableObject(stub, (_instance, state) => {
    const rows = state.storage.sql
      .exec<{ state: string }>("SELECT state FROM breakers WHERE origin = ?", origin)
      .toArray();
    return rows[0]?.state ?? null;
  });
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("an open breaker whose object restarts during its cooldown", () => {
  it("is probed and closed by its own alarms, with no reporter calling again", async () => {
    const region = regionOf("evicted");
    const stub = env.ORIGIN_BREAKERS.getByName(region.id);
    const views = await stub.report(region, [failures(`a@evicted`)]);
    expect(views.find((v) => v.origin === `a@evicted`)?.state).toBe("open");
    await evictDurableObject(stub);
    // The fresh instance's alarms half-open it and probe it (completing a token) until it
    // closes; running them here only saves waiting for them.
    let state = await keptState(stub, `a@evicted`);
    for (let i = 0; i < 60 && state !== "closed"; i++) {
      await pause(50);
      await runDurableObjectAlarm(stub);
      state = await keptState(stub, `a@evicted`);
    }
    expect(state).toBe("closed");
    // Nothing left to do: no alarm stays armed.
    expect(await runInDurableObject(stub, (_i, ctx) => ctx.storage.getAlarm())).toBeNull();
  });

  it("half-opens on the next report when its cooldown passed while nobody watched", async () => {
    const region = regionOf("late");
    const stub = env.ORIGIN_BREAKERS.getByName(region.id);
    await stub.report(region, [failures(`a@late`)]);
    await evictDurableObject(stub);
    await pause(150);
    const views = await stub.views(region);
    expect(views.find((v) => v.origin === `a@late`)?.state).toBe("half_open");
  });
});

describe("failures in a row, one at a time, the object evicted between them", () => {
  it("still add up to the opening (a frozen origin asked once a minute)", async () => {
    const region = regionOf("one-by-one");
    const stub = env.ORIGIN_BREAKERS.getByName(region.id);
    const one = { origin: `a@one-by-one`, requests: 1, failures: 1, trailing: 1 };
    const first = await stub.report(region, [one]);
    expect(first.find((v) => v.origin === `a@one-by-one`)?.state).toBe("closed");
    await evictDurableObject(stub);
    const second = await stub.report(region, [one]);
    expect(second.find((v) => v.origin === `a@one-by-one`)?.state).toBe("open");
  });
});

describe("the ejection cap", () => {
  it("opens at most half of a region's origins, whatever fails them, and one more once one closes", async () => {
    const region = regionOf("cap");
    const stub = env.ORIGIN_BREAKERS.getByName(region.id);
    await stub.report(region, [failures(`a@cap`)]);
    const views = await stub.report(region, [failures(`b@cap`)]);
    expect(views.map((v) => v.state).sort()).toEqual(["closed", "open"]);
    // b kept failing while a was open; once a is forced closed, b's next failure opens it.
    await stub.force(region, `a@cap`, "closed");
    const after = await stub.report(region, [failures(`b@cap`)]);
    expect(after.find((v) => v.origin === `b@cap`)?.state).toBe("open");
  });
});

// Port 9 (discard) has nothing listening on the test machine: the connection is refused.
// full-1 accepts every connection and closes it at once, as an origin far past its cap does.
const reachRegion = (tag: string): BreakerRegion => ({
  id: `reach-${tag}`,
  origins: [
    { id: `gone@${tag}`, url: "http://127.0.0.1:9" },
    { id: `full@${tag}`, url: originUrl("full-1") },
    { id: `alive@${tag}`, url: originUrl("us-1") },
  ],
  settings: { ...DEFAULT_BREAKER_SETTINGS, consecutiveFailures: 5 },
});
const oneFailure = (origin: string) => ({ origin, requests: 1, failures: 1, trailing: 1 });

/** The origin's breaker once it leaves closed, or closed after a second. */
async function stateAfter(stub: DurableObjectStub<OriginBreakers>, r: BreakerRegion, id: string) {
  let state = "closed";
  for (let i = 0; i < 40 && state === "closed"; i++) {
    await pause(25);
    state = (await stub.views(r)).find((v) => v.origin === id)?.state ?? "missing";
  }
  return state;
}

describe("a reach check of an origin that just failed", () => {
  it("opens the breaker of one that cannot be reached after its first failure", async () => {
    const r = reachRegion("gone");
    const stub = env.ORIGIN_BREAKERS.getByName(r.id);
    const views = await stub.report(r, [oneFailure(`gone@gone`)]);
    expect(views.find((v) => v.origin === `gone@gone`)?.state).toBe("closed");
    expect(await stateAfter(stub, r, `gone@gone`)).toBe("open");
    const view = (await stub.views(r)).find((v) => v.origin === `gone@gone`);
    expect(view).toMatchObject({ opened_count: 1, forced: false });
  });

  it("leaves closed the breaker of one that accepts connections, even one it drops", async () => {
    const r = reachRegion("full");
    const stub = env.ORIGIN_BREAKERS.getByName(r.id);
    await stub.report(r, [oneFailure(`full@full`), oneFailure(`alive@full`)]);
    const states = await Promise.all([
      stateAfter(stub, r, `full@full`),
      stateAfter(stub, r, `alive@full`),
    ]);
    expect(states).toEqual(["closed", "closed"]);
    // The same failures from an origin that is gone open its breaker: the checks did run.
    await stub.report(r, [oneFailure(`gone@full`)]);
    expect(await stateAfter(stub, r, `gone@full`)).toBe("open");
  });

  it("runs once more after a failure within a second of the last check", async () => {
    const r = reachRegion("again");
    const stub = env.ORIGIN_BREAKERS.getByName(r.id);
    // Checked (and found there) at its first failure; it fails again at once: the second
    // check waits out the gap, then runs. The ejection cap has room for one of three.
    await stub.report(r, [oneFailure(`alive@again`)]);
    await stub.report(r, [oneFailure(`gone@again`)]);
    await stub.report(r, [oneFailure(`gone@again`)]);
    expect(await stateAfter(stub, r, `gone@again`)).toBe("open");
  });
});
