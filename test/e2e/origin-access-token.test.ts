import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningStack, startStack } from "../../scripts/stack.ts";

// Origins reachable from other hosts run with --access-token; the edge presents the
// ORIGIN_TOKEN secret on every batch and cancel call.
let stack: RunningStack;

beforeAll(async () => {
  stack = await startStack({
    regions: [{ id: "eu", continents: ["EU"], origins: 1 }],
    sim: { timeScale: 0 },
    originAccessToken: "origin-secret-for-tests",
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
