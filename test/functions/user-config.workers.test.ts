import { createExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import app from "../../functions/index.ts";
import { loadConfig } from "../../contracts/config/gateway.ts";
import { resolveModels } from "../../contracts/config/models.ts";
import { originServes } from "../../contracts/config/regions.ts";
import { deploymentProblems } from "../../functions/deployment.ts";
import { edgeRequest } from "../support/edge-requests.ts";

// A deployment's own configuration, checked in workerd as the Worker runs it:
//   WARMGATE_CONFIG_FILE=my-config.json npm run test:workers -- test/functions/user-config
const text = (env as unknown as { WARMGATE_USER_CONFIG?: string }).WARMGATE_USER_CONFIG ?? "";

describe.skipIf(text === "")("your WARMGATE_CONFIG", () => {
  it("passes the Worker's start-up checks for a deployment", () => {
    expect(deploymentProblems({ WARMGATE_CONFIG: text, ADMIN_TOKEN: "x" })).toEqual([]);
  });

  it("has an origin for every model and a model for every alias", () => {
    const config = loadConfig(text);
    for (const model of config.models) {
      const served = config.regions.some((r) => r.origins.some((o) => originServes(o, model.id)));
      expect(served, `no origin serves ${model.id}`).toBe(true);
    }
    for (const alias of Object.keys(config.aliases)) {
      expect(resolveModels(config, alias).length, `alias ${alias}`).toBeGreaterThan(0);
    }
  });

  it("lists its models at GET /v1/models", async () => {
    const config = loadConfig(text);
    const response = await app.fetch(
      edgeRequest("/v1/models"),
      { ...env, WARMGATE_CONFIG: text },
      createExecutionContext(),
    );
    expect(response.status).toBe(200);
    const { data } = await response.json<{ data: { id: string }[] }>();
    expect(data.map((m) => m.id)).toEqual(config.models.map((m) => m.id));
  });
});
