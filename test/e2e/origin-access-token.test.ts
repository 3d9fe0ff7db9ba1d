import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningStack, startStack } from "../../scripts/stack.ts";

// The stack's origins run with an access token and an admin token, as origins reachable
// from other hosts must; the edge presents the ORIGIN_TOKEN secret on every batch and
// cancel call.
let stack: RunningStack;

beforeAll(async () => {
  stack = await startStack({
    regions: [{ id: "eu", continents: ["EU"], origins: 1 }],
    sim: { timeScale: 0 },
  });
});

afterAll(async () => {
  await stack?.stop();
});

const body = JSON.stringify({
  model: "warmgate-sim-8b",
  messages: [{ role: "user", content: "Who may call the origin?" }],
  max_tokens: 4,
});

describe("an origin with an access token", () => {
  it("refuses a caller that does not present the token", async () => {
    const origin = stack.origins[0]?.origin.url ?? "";
    const res = await fetch(`${origin}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    expect(res.status).toBe(401);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe(
      "invalid_access_token",
    );
  });

  it("refuses a batch without the token: no inference that skips keys and the ledger", async () => {
    const origin = stack.origins[0]?.origin.url ?? "";
    const res = await fetch(`${origin}/v1/batch`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ v: 1, batch_id: "b", items: [] }),
    });
    expect(res.status).toBe(401);
    await res.arrayBuffer();
  });

  it("keeps fault injection behind the origin admin token", async () => {
    const origin = stack.origins[0]?.origin.url ?? "";
    const put = (authorization?: string) =>
      fetch(`${origin}/admin/faults`, {
        method: "PUT",
        headers: { "content-type": "application/json", ...(authorization && { authorization }) },
        body: JSON.stringify({ errorRate: 0 }),
      });
    const anonymous = await put();
    expect(anonymous.status).toBe(401);
    await anonymous.arrayBuffer();
    const withAccess = await put(`Bearer ${stack.originAccessToken}`);
    expect(withAccess.status).toBe(401);
    await withAccess.arrayBuffer();
    const withAdmin = await put(`Bearer ${stack.originAdminToken}`);
    expect(withAdmin.status).toBe(200);
    await withAdmin.arrayBuffer();
  });

  it("serves the edge, which presents ORIGIN_TOKEN", async () => {
    const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
      body,
    });
    expect(res.status).toBe(200);
    const json = (await res.json()) as { usage: { completion_tokens: number } };
    expect(json.usage.completion_tokens).toBeGreaterThan(0);
  });
});
