import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { ADMIN, createKey } from "../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../support/edge-requests.ts";

describe("error messages quote little of the input", () => {
  it("answers a 2 MB role with a short message naming the field", async () => {
    const role = "x".repeat(2_000_000);
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        body: chatBody({ messages: [{ role, content: "hi" }] }),
      }),
    );
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text.length).toBeLessThan(1_000);
    const { error } = JSON.parse(text) as ErrorBody;
    expect(error.param).toBe("messages[0].role");
    expect(error.message).toContain("(2000000 characters)");
  });

  it("clips a huge unknown model name", async () => {
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody({ model: "m".repeat(100_000) }) }),
    );
    expect(res.status).toBe(404);
    expect((await res.text()).length).toBeLessThan(1_000);
  });
});

const chatIn = (key: string, region: string) =>
  exports.default.fetch(
    edgeRequest("/v1/chat/completions", {
      body: chatBody({ max_tokens: 2 }),
      headers: { authorization: `Bearer ${key}` },
      region,
    }),
  );

describe("x-warmgate-region", () => {
  it("is refused for a key created without allow_region_override", async () => {
    const { key } = await createKey({ name: "no-override", allow_region_override: false });
    const res = await chatIn(key, "eu");
    expect(res.status).toBe(403);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      type: "permission_error",
      code: "region_override_not_allowed",
      param: "x-warmgate-region",
    });
  });

  it("is off by default and shown on the key", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: ADMIN,
      body: JSON.stringify({ name: "default-override" }),
    });
    const created = await res.json<{ key: string; allow_region_override: boolean }>();
    expect(created.allow_region_override).toBe(false);
    expect((await chatIn(created.key, "eu")).status).toBe(403);
  });

  it("is honoured for a key that allows it, and an unknown region is refused briefly", async () => {
    const { key } = await createKey({ name: "override", allow_region_override: true });
    const served = await chatIn(key, "eu");
    expect(served.status).toBe(200);
    expect(served.headers.get("x-warmgate-region")).toBe("eu");
    await served.arrayBuffer();
    const unknown = await chatIn(key, "r".repeat(5_000));
    expect(unknown.status).toBe(400);
    const text = await unknown.text();
    expect(text.length).toBeLessThan(1_000);
    expect((JSON.parse(text) as ErrorBody).error.code).toBe("invalid_region");
  });
});

describe("JSON content type on the admin and token routes", () => {
  it("refuses an admin body that is not declared JSON", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: { authorization: ADMIN.authorization, "content-type": "text/plain" },
      body: JSON.stringify({ name: "plain" }),
    });
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error.code).toBe("unsupported_content_type");
  });

  it("refuses a token request that is not declared JSON", async () => {
    const { key } = await createKey({
      name: "tokens-type",
      allowed_origins: ["https://app.example"],
    });
    const res = await exports.default.fetch("http://edge.test/v1/tokens", {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/x-www-form-urlencoded",
      },
      body: "user=alice",
    });
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error.code).toBe("unsupported_content_type");
  });

  it("refuses an admin body over the size limit with 413", async () => {
    const res = await exports.default.fetch("http://edge.test/admin/keys", {
      method: "POST",
      headers: ADMIN,
      body: JSON.stringify({ name: "n".repeat(200_000) }),
    });
    expect(res.status).toBe(413);
    expect((await res.json<ErrorBody>()).error.type).toBe("invalid_request_error");
  });
});
