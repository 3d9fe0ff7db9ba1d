import { env } from "cloudflare:workers";
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import app from "../../../functions/index.ts";
import { type ErrorBody, chatBody, edgeRequest, lastEvent } from "../../support/edge-requests.ts";
import { originUrl, sendWith } from "../../support/test-origins.workers.ts";

// garbled-1 answers the batch protocol, garbling the frame each request's `user` names;
// this file alone sends it requests that way, straight (batching off) and through a Batcher.
function configOf(tag: string, batching: boolean): string {
  return JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
    regions: [
      { id: `garbled-${tag}`, origins: [{ id: `garbled@${tag}`, url: originUrl("garbled-1") }] },
    ],
    default_region: `garbled-${tag}`,
    batching: { enabled: batching, idle_bypass_ms: 0 },
    breakers: { enabled: false },
  });
}

const chat = (user: string, stream = false) =>
  edgeRequest("/v1/chat/completions", { body: chatBody({ user, stream }) });

describe.each([
  ["straight to the origin", false],
  ["through the Batcher", true],
])("a request whose origin sends a malformed frame, %s", (tag, batching) => {
  const config = configOf(batching ? "batched" : "direct", batching);

  it("is answered 502 origin_error when its HEAD is not JSON", async () => {
    const res = await sendWith(config, chat("bad-head"));
    expect(res.status).toBe(502);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      type: "server_error",
      code: "origin_error",
    });
  });

  it("is answered 502 origin_error when its call's first LOAD is not a load report", async () => {
    const res = await sendWith(config, chat("bad-load"));
    expect(res.status).toBe(502);
    expect((await res.json<ErrorBody>()).error.code).toBe("origin_error");
  });

  it(`ends its stream with the origin_error event when its END is malformed (${tag})`, async () => {
    const ctx = createExecutionContext();
    const res = await app.fetch(chat("bad-end", true), { ...env, WARMGATE_CONFIG: config }, ctx);
    expect(res.status).toBe(200);
    // The origin sends the END once the HEAD is in.
    await fetch(`${originUrl("garbled-1")}/release`, { method: "POST" });
    const { last, done } = lastEvent(await res.text());
    await waitOnExecutionContext(ctx);
    expect(done).toBe(false);
    expect(last).toMatchObject({ error: { type: "server_error", code: "origin_error" } });
  });
});
