import { describe, expect, inject, it } from "vitest";
import { createKey, createTeam } from "../../support/admin-keys.workers.ts";
import { edgeRequest } from "../../support/edge-requests.ts";
import { sendWith } from "../../support/test-origins.workers.ts";

const CONFIG = inject("warmgateConfig");

async function get(path: string, bearer: string): Promise<Response> {
  return sendWith(CONFIG, edgeRequest(path, { headers: { authorization: `Bearer ${bearer}` } }));
}

async function listed(bearer: string): Promise<string[]> {
  const res = await get("/v1/models", bearer);
  expect(res.status).toBe(200);
  return (await res.json<{ data: { id: string }[] }>()).data.map((m) => m.id);
}

describe("GET /v1/models", () => {
  it("lists every model for a key that may use them all", async () => {
    const { key } = await createKey({ name: "all-models" });
    expect(await listed(key)).toEqual(["warmgate-sim-8b", "warmgate-sim-70b"]);
  });

  it("lists only the models the key may use, and finds no other", async () => {
    const { key } = await createKey({ name: "only-70b", models: ["warmgate-sim-70b"] });
    expect(await listed(key)).toEqual(["warmgate-sim-70b"]);
    expect((await get("/v1/models/warmgate-sim-70b", key)).status).toBe(200);
    for (const name of ["warmgate-sim-8b", "fast"]) {
      const res = await get(`/v1/models/${name}`, key);
      expect(res.status).toBe(404);
      expect(await res.json()).toMatchObject({ error: { code: "model_not_found" } });
    }
  });

  it("narrows to a browser token's models", async () => {
    const { key } = await createKey({ name: "token-models" });
    const minted = await sendWith(
      CONFIG,
      edgeRequest("/v1/tokens", {
        body: { user: "u1", models: ["warmgate-sim-8b"] },
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(minted.status).toBe(200);
    const { token } = await minted.json<{ token: string }>();
    expect(await listed(token)).toEqual(["warmgate-sim-8b"]);
    expect((await get("/v1/models/fast", token)).status).toBe(200);
  });

  it("lists only what the key's team allows as well, as admission decides it", async () => {
    const team = await createTeam({ name: "only-70b", models: ["warmgate-sim-70b"] });
    const { key } = await createKey({ name: "team-member", team_id: team.id });
    // Before the key's first request: its account asks the team once.
    expect(await listed(key)).toEqual(["warmgate-sim-70b"]);
    expect((await get("/v1/models/warmgate-sim-8b", key)).status).toBe(404);
    const refused = await sendWith(
      CONFIG,
      edgeRequest("/v1/chat/completions", {
        body: { model: "warmgate-sim-8b", messages: [{ role: "user", content: "hi" }] },
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(refused.status).toBe(403);
    expect(await refused.json()).toMatchObject({ error: { code: "model_not_allowed" } });
    expect(await listed(key)).toEqual(["warmgate-sim-70b"]);
  });

  it("narrows a browser token's models to its key's team's", async () => {
    const team = await createTeam({ name: "only-8b", models: ["warmgate-sim-8b"] });
    const { key } = await createKey({ name: "team-tokens", team_id: team.id });
    const minted = await sendWith(
      CONFIG,
      edgeRequest("/v1/tokens", {
        body: { user: "u2" },
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(minted.status).toBe(200);
    const { token } = await minted.json<{ token: string }>();
    expect(await listed(token)).toEqual(["warmgate-sim-8b"]);
    // A token for a model the team does not allow is not minted.
    const outside = await sendWith(
      CONFIG,
      edgeRequest("/v1/tokens", {
        body: { user: "u3", models: ["warmgate-sim-70b"] },
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(outside.status).toBe(400);
    expect(await outside.json()).toMatchObject({ error: { code: "model_not_allowed" } });
  });
});
