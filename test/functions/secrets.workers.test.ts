import { createExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import app from "../../functions/index.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../support/edge-requests.ts";

// `npx wrangler dev` without .dev.vars: the secrets are unset.
const bare = { ...env, ADMIN_TOKEN: undefined, TOKEN_SIGNING_SECRET: undefined };

describe("a gateway without its secrets", () => {
  it("answers a keyed request with a config_error naming the secret and how to set it", async () => {
    const response = await app.fetch(
      edgeRequest("/v1/chat/completions", { body: chatBody() }),
      bare,
      createExecutionContext(),
    );
    expect(response.status).toBe(500);
    const { error } = await response.json<ErrorBody>();
    expect(error.code).toBe("config_error");
    expect(error.message).toContain("TOKEN_SIGNING_SECRET is not set");
    expect(error.message).toContain(".dev.vars.example");
  });

  it("answers the admin API with a config_error, not a bare 401", async () => {
    const response = await app.fetch(
      edgeRequest("/admin/keys", { headers: { authorization: "Bearer anything" } }),
      bare,
      createExecutionContext(),
    );
    expect(response.status).toBe(500);
    const { error } = await response.json<ErrorBody>();
    expect(error).toMatchObject({ code: "config_error" });
    expect(error.message).toContain("ADMIN_TOKEN is not set");
  });
});
