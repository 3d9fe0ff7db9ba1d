import { describe, expect, it } from "vitest";
import { wranglerDevEnv } from "../../scripts/edge.ts";

describe("wrangler dev as the local stack runs it", () => {
  it("runs without wrangler's local trace collector unless asked for, as deployed", () => {
    expect(wranglerDevEnv({}).X_LOCAL_OBSERVABILITY).toBe("false");
    expect(wranglerDevEnv({ localObservability: false }).X_LOCAL_OBSERVABILITY).toBe("false");
    expect(wranglerDevEnv({ localObservability: true }).X_LOCAL_OBSERVABILITY).toBe("true");
  });

  it("stays offline and sends no metrics", () => {
    const env = wranglerDevEnv({});
    expect([env.WRANGLER_SEND_METRICS, env.CLOUDFLARE_CF_FETCH_ENABLED]).toEqual([
      "false",
      "false",
    ]);
  });
});
