import { describe, expect, inject, it } from "vitest";
import { createKey } from "../../support/admin-keys.workers.ts";
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
});
