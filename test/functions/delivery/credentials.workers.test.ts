import { describe, expect, inject, it } from "vitest";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { CREDENTIAL_ORIGIN_TOKEN } from "../../support/provided-context.ts";
import { sendWith } from "../../support/test-origins.workers.ts";

// credential-1 demands CREDENTIAL_ORIGIN_TOKEN; this file alone calls it.
const origin = inject("testOrigins").find((o) => o.id === "credential-1");

function configOf(tag: string, credentials: string[]): string {
  if (origin === undefined) throw new Error("credential-1 is not running");
  return JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
    regions: [
      { id: `cred-${tag}`, origins: [{ id: `credential-1@${tag}`, url: origin.url, credentials }] },
    ],
    default_region: `cred-${tag}`,
    batching: { enabled: false },
    breakers: { enabled: false },
  });
}

const send = (config: string, secrets: Record<string, string>) =>
  sendWith(
    config,
    edgeRequest("/v1/chat/completions", { body: chatBody({ max_tokens: 3 }) }),
    secrets,
  );

describe("an origin's credentials", () => {
  it("rotate to the next one when the origin refuses the first, unseen by the client", async () => {
    const config = configOf("rotate", ["OLD_ORIGIN_TOKEN", "NEW_ORIGIN_TOKEN"]);
    const secrets = {
      OLD_ORIGIN_TOKEN: "revoked-token",
      NEW_ORIGIN_TOKEN: CREDENTIAL_ORIGIN_TOKEN,
    };
    for (let i = 0; i < 3; i++) {
      const res = await send(config, secrets);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("credential-1@rotate");
    }
  });

  it("never reach the client when every one is refused", async () => {
    const config = configOf("refused", ["OLD_ORIGIN_TOKEN", "NEW_ORIGIN_TOKEN"]);
    const res = await send(config, {
      OLD_ORIGIN_TOKEN: "revoked-a",
      NEW_ORIGIN_TOKEN: "revoked-b",
    });
    expect(res.status).toBeGreaterThanOrEqual(500);
    const text = await res.text();
    expect(text).not.toContain("revoked-a");
    expect(text).not.toContain("revoked-b");
    expect((JSON.parse(text) as ErrorBody).error.type).toBe("server_error");
  });
});
