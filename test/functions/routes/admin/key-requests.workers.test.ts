import { describe, expect, inject, it } from "vitest";
import { createKey } from "../../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../../support/edge-requests.ts";
import { adminRequest, sendWith } from "../../../support/test-origins.workers.ts";

const CONFIG = inject("warmgateConfig");

interface RequestView {
  id: string;
  model: string;
  status: string;
  total_tokens: number;
  cost_usd: number;
  attempts: { region: string; origin: string | null; result: string }[];
}

async function served(key: string): Promise<{ requestId: string; cost: number }> {
  const res = await sendWith(
    CONFIG,
    edgeRequest("/v1/chat/completions", {
      body: chatBody(),
      headers: { authorization: `Bearer ${key}` },
    }),
  );
  expect(res.status).toBe(200);
  return {
    requestId: res.headers.get("x-request-id") ?? "",
    cost: Number(res.headers.get("x-warmgate-cost-usd")),
  };
}

describe("GET /admin/keys/{id}/requests/{request_id}", () => {
  it("shows the admin one request of a key: tokens, cost and the origin that served it", async () => {
    const { id, key } = await createKey({ name: "one-request" });
    const { requestId, cost } = await served(key);
    const res = await sendWith(CONFIG, adminRequest(`/admin/keys/${id}/requests/${requestId}`));
    expect(res.status).toBe(200);
    const view = await res.json<RequestView>();
    expect(view).toMatchObject({ id: requestId, model: "warmgate-sim-8b", status: "settled" });
    expect(view.total_tokens).toBeGreaterThan(0);
    expect(view.cost_usd).toBe(cost);
    expect(view.attempts.at(-1)?.result).toBe("served");
  });

  it("answers 404 for a request of another key, an unknown key or a malformed id", async () => {
    const first = await createKey({ name: "one-request-a" });
    const second = await createKey({ name: "one-request-b" });
    const { requestId } = await served(first.key);
    const other = await sendWith(
      CONFIG,
      adminRequest(`/admin/keys/${second.id}/requests/${requestId}`),
    );
    expect(other.status).toBe(404);
    expect((await other.json<ErrorBody>()).error.code).toBe("request_not_found");
    for (const keyId of ["abcdefghijklmnop", "not-a-key-id"]) {
      const res = await sendWith(
        CONFIG,
        adminRequest(`/admin/keys/${keyId}/requests/${requestId}`),
      );
      expect(res.status).toBe(404);
      expect((await res.json<ErrorBody>()).error.code).toBe("key_not_found");
    }
  });

  it("refuses the key's own secret: only the admin token reads it", async () => {
    const { id, key } = await createKey({ name: "one-request-secret" });
    const { requestId } = await served(key);
    const res = await sendWith(
      CONFIG,
      new Request(`https://edge.test/admin/keys/${id}/requests/${requestId}`, {
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(res.status).toBe(401);
    expect((await res.json<ErrorBody>()).error.code).toBe("invalid_admin_token");
  });
});

describe("the admin API across sites", () => {
  it("grants no CORS to any origin, not even one a key allows, so another site's page cannot call it", async () => {
    await createKey({ name: "cors-shop", allowed_origins: ["https://shop.example"] });
    for (const origin of ["https://shop.example", "https://evil.example"]) {
      const preflight = await sendWith(
        CONFIG,
        new Request("https://edge.test/admin/keys", {
          method: "OPTIONS",
          headers: {
            origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
          },
        }),
      );
      expect(preflight.headers.get("access-control-allow-origin")).toBeNull();
      // A form post from that site carries no Authorization header: refused before any change.
      const post = await sendWith(
        CONFIG,
        new Request("https://edge.test/admin/keys", {
          method: "POST",
          headers: { origin, "content-type": "application/x-www-form-urlencoded" },
          body: "name=forged",
        }),
      );
      expect(post.status).toBe(401);
      expect(post.headers.get("access-control-allow-origin")).toBeNull();
    }
  });
});
