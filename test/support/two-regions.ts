/**
 * A whole local stack (scripts/stack.ts, docs/edge.md) with one origin in each of two
 * regions, `eu` and `us`, so `x-warmgate-region` pins the origin that serves a request.
 * Registers the suite's hooks: start before, stop after, clear the eu origin's faults
 * after each test.
 */
import { afterAll, afterEach, beforeAll } from "vitest";
import { type RunningStack, type StackOptions, startStack } from "../../scripts/stack.ts";

export interface TwoRegions {
  stack: RunningStack;
  /** The eu origin's URL. */
  euOrigin: string;
  /** Headers of the origins' admin API. */
  originAdmin: () => Record<string, string>;
}

/** The suite's stack, filled in once `beforeAll` has started it. */
export function twoRegionStack(sim: StackOptions["sim"], onStarted?: (s: TwoRegions) => void) {
  const ready = {} as TwoRegions;
  ready.originAdmin = () => ({ authorization: `Bearer ${ready.stack.originAdminToken}` });
  beforeAll(async () => {
    ready.stack = await startStack({
      regions: [
        { id: "eu", continents: ["EU"], origins: 1 },
        { id: "us", continents: ["NA"], origins: 1 },
      ],
      sim,
    });
    const eu = ready.stack.origins.find((o) => o.region === "eu");
    if (eu === undefined) throw new Error("no eu origin");
    ready.euOrigin = eu.origin.url;
    onStarted?.(ready);
  }, 180_000);
  afterAll(async () => {
    await ready.stack?.stop();
  });
  afterEach(async () => {
    const cleared = await fetch(`${ready.euOrigin}/admin/faults`, {
      method: "DELETE",
      headers: ready.originAdmin(),
    });
    await cleared.arrayBuffer();
  });
  return ready;
}
