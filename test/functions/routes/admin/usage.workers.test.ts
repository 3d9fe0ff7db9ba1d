import { describe, expect, inject, it } from "vitest";
import { createKey } from "../../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../../support/edge-requests.ts";
import { adminRequest, sendWith } from "../../../support/test-origins.workers.ts";

const CONFIG = inject("warmgateConfig");

interface UsageView {
  user: string | null;
  total: { requests: number };
  keys: { key_id: string; requests: number }[];
}

async function adminUsage(query: string): Promise<Response> {
  return sendWith(CONFIG, adminRequest(`/admin/usage${query}`));
}

describe("GET /admin/usage", () => {
  it("answers one end user's requests when asked with user", async () => {
    const { id, key } = await createKey({ name: "usage-by-user" });
    for (const user of ["alice", "bob", "bob"]) {
      const res = await sendWith(
        CONFIG,
        edgeRequest("/v1/chat/completions", {
          body: chatBody({ user }),
          headers: { authorization: `Bearer ${key}` },
        }),
      );
      expect(res.status).toBe(200);
    }
    const all = await adminUsage(`?key_id=${id}`);
    expect((await all.json<UsageView>()).total.requests).toBe(3);
    const bob = await adminUsage(`?key_id=${id}&user=bob`);
    expect(bob.status).toBe(200);
    expect(await bob.json<UsageView>()).toMatchObject({
      user: "bob",
      total: { requests: 2 },
      keys: [{ key_id: id, requests: 2 }],
    });
    const carol = await adminUsage(`?user=carol`);
    expect((await carol.json<UsageView>()).total.requests).toBe(0);
  });

  it("refuses a filter it does not support with OpenAI's 400 naming it", async () => {
    const res = await adminUsage("?model=warmgate-sim-8b");
    expect(res.status).toBe(400);
    expect(await res.json<ErrorBody>()).toEqual({
      error: {
        message: expect.stringContaining("'model'") as string,
        type: "invalid_request_error",
        param: "model",
        code: "unsupported_parameter",
      },
    });
  });

  it("refuses an empty user", async () => {
    const res = await adminUsage("?user=");
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error.param).toBe("user");
  });
});

describe("GET /v1/usage", () => {
  it("refuses a filter it does not support", async () => {
    const res = await sendWith(CONFIG, edgeRequest("/v1/usage?key_id=other"));
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      param: "key_id",
      code: "unsupported_parameter",
    });
  });
});
