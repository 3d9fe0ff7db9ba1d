import { env } from "cloudflare:workers";
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
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

/** Calls the garbling origin took for `mute` items, and those it heard stopped. */
const muted = async () =>
  (await fetch(`${originUrl("garbled-1")}/muted`)).json<{
    taken: number;
    stopped: number;
    frozen: number;
    thawed: number;
  }>();

describe("a JSON completion whose origin takes the call and never answers it", () => {
  it("is given up at its first-byte timeout (504 origin_timeout), its item stopped", async () => {
    const config = JSON.stringify({
      ...JSON.parse(configOf("mute", false)),
      limits: { first_byte_timeout_ms: 300 },
    });
    const before = await muted();
    const res = await sendWith(config, chat("mute"));
    expect(res.status).toBe(504);
    expect((await res.json<ErrorBody>()).error.code).toBe("origin_timeout");
    // The origin hears of it: the call closed unanswered, or its item cancelled by id.
    await vi.waitFor(
      async () => {
        const after = await muted();
        expect(after.taken).toBe(before.taken + 1);
        expect(after.stopped).toBe(before.stopped + 1);
      },
      { timeout: 5_000, interval: 50 },
    );
  });

  it("is answered by the next origin, and the item on the mute one is stopped", async () => {
    // One mute origin and one that answers: whichever is tried first, every call the mute
    // one took is stopped although the request was served.
    const config = JSON.stringify({
      ...JSON.parse(configOf("mute-then-sim", false)),
      regions: [
        {
          id: "garbled-mute-then-sim",
          origins: [
            { id: "garbled@mute-then-sim", url: originUrl("garbled-1") },
            { id: "sim@mute-then-sim", url: originUrl("eu-1") },
          ],
        },
      ],
      limits: { first_byte_timeout_ms: 300 },
    });
    const before = await muted();
    let tried = 0;
    for (let i = 0; i < 6; i++) {
      const res = await sendWith(config, chat("mute"));
      expect(res.status).toBe(200);
      tried += Number(res.headers.get("x-warmgate-attempts")) - 1;
    }
    expect(tried).toBeGreaterThan(0);
    await vi.waitFor(
      async () => {
        const after = await muted();
        expect(after.taken - before.taken).toBe(tried);
        expect(after.stopped - before.stopped).toBe(tried);
      },
      { timeout: 5_000, interval: 50 },
    );
  });
});

describe.each([
  ["straight to the origin", false],
  ["through the Batcher", true],
])(
  "a JSON completion whose origin reports itself idle and never answers it, %s",
  (tag, batching) => {
    const config = (name: string, origins: { id: string; url: string }[]) =>
      JSON.stringify({
        ...JSON.parse(configOf(name, batching)),
        regions: [{ id: `garbled-${name}`, origins }],
        // Its HEAD would come with the whole answer: only the idle reports are timed.
        limits: { first_byte_timeout_ms: 400, retry_budget: 1, retry_floor: 10_000 },
      });

    it("is given up once its origin's reports showed it idle that long (504)", async () => {
      const name = `hang-${batching ? "batched" : "direct"}`;
      const before = await muted();
      const res = await sendWith(
        config(name, [{ id: `garbled@${name}`, url: originUrl("garbled-1") }]),
        chat("hang"),
      );
      expect(res.status).toBe(504);
      expect((await res.json<ErrorBody>()).error.code).toBe("origin_timeout");
      await vi.waitFor(
        async () => expect((await muted()).stopped).toBeGreaterThan(before.stopped),
        { timeout: 5_000, interval: 50 },
      );
    });

    it(`is answered by the next origin (${tag})`, async () => {
      const name = `hang-then-sim-${batching ? "batched" : "direct"}`;
      const origins = [
        { id: `garbled@${name}`, url: originUrl("garbled-1") },
        { id: `sim@${name}`, url: originUrl("eu-1") },
      ];
      let tried = 0;
      for (let i = 0; i < 4; i++) {
        const res = await sendWith(config(name, origins), chat("hang"));
        expect(res.status).toBe(200);
        expect(res.headers.get("x-warmgate-origin")).toBe(`sim@${name}`);
        tried += Number(res.headers.get("x-warmgate-attempts")) - 1;
      }
      expect(tried).toBeGreaterThan(0);
    });

    it(`is given up after slow_first_byte_ms of idle reports, not at its first-byte timeout (${tag})`, async () => {
      // A first-byte timeout beyond the test's own: only the idle rule can end the wait.
      const name = `hang-slow-${batching ? "batched" : "direct"}`;
      const slowConfig = JSON.stringify({
        ...JSON.parse(config(name, [{ id: `garbled@${name}`, url: originUrl("garbled-1") }])),
        limits: { first_byte_timeout_ms: 120_000, retry_budget: 1, retry_floor: 10_000 },
        breakers: { enabled: true, slow_first_byte_ms: 300 },
      });
      const res = await sendWith(slowConfig, chat("hang"));
      expect(res.status).toBe(504);
      expect((await res.json<ErrorBody>()).error.code).toBe("origin_timeout");
      expect(res.headers.get("x-warmgate-attempts")).toBe("1");
    });
  },
);

describe("a stream straight to an origin that froze after its first bytes", () => {
  it("is cut with the origin_error event once the origin answers nothing for slow_first_byte_ms, its call closed", async () => {
    const config = JSON.stringify({
      ...JSON.parse(configOf("freeze", false)),
      breakers: { enabled: true, slow_first_byte_ms: 300 },
    });
    const before = await muted();
    const res = await sendWith(config, chat("freeze", true));
    expect(res.status).toBe(200);
    const text = await res.text();
    // Its first bytes came through as they were; then the error event, and no [DONE].
    expect(text.startsWith('data: {"object":"chat.completion.chunk"}\n\n')).toBe(true);
    const { last, done } = lastEvent(text);
    expect(done).toBe(false);
    expect(last).toMatchObject({ error: { type: "server_error", code: "origin_error" } });
    await vi.waitFor(
      async () => {
        const after = await muted();
        expect(after.frozen).toBe(before.frozen + 1);
        expect(after.thawed).toBe(before.thawed + 1);
      },
      { timeout: 5_000, interval: 50 },
    );
  });
});
