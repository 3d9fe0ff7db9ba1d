import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningStack, startStack } from "../../scripts/stack.ts";

// The benchmarks' default runtime: the edge under workerd without wrangler's dev proxy
// (scripts/workerd.ts), with the same bindings and Durable Objects as `wrangler dev`.
let stack: RunningStack;

beforeAll(async () => {
  stack = await startStack({
    regions: [{ id: "eu", continents: ["EU"], origins: 1 }],
    sim: { timeScale: 0 },
    runtime: "workerd",
  });
});

afterAll(async () => {
  await stack?.stop();
});

describe("the edge under workerd without the dev proxy", () => {
  it("answers completions with its keys, Durable Objects and batcher", async () => {
    const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${stack.apiKey}` },
      body: JSON.stringify({
        model: "warmgate-sim-8b",
        messages: [{ role: "user", content: "Which runtime is this?" }],
        max_tokens: 4,
        stream: true,
      }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    expect(res.headers.get("x-warmgate-origin")).toBe("eu-1");
    expect(await res.text()).toMatch(/data: \[DONE\]\n\n$/);
  });

  it("refuses an unknown key with an OpenAI-shaped 401", async () => {
    const res = await fetch(`${stack.edgeUrl}/v1/models`, {
      headers: { authorization: "Bearer wg_not_a_key" },
    });
    expect(res.status).toBe(401);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("invalid_api_key");
  });

  it("stops with the stack, leaving no workerd behind", async () => {
    const pid = stack.edge.pid;
    expect(pid).toBeDefined();
    await stack.stop();
    expect(() => process.kill(pid ?? 0, 0)).toThrow(/ESRCH/);
  });
});
