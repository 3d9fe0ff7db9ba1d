import { afterEach, describe, expect, it } from "vitest";
import type { CanaryView } from "../../../contracts/canary.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import {
  adminRequest,
  originUrl,
  sendWith,
  setFaults,
} from "../../support/test-origins.workers.ts";

// canary-1 and canary-2 are this file's alone.

/** One region of canary-1 (the canary, under a fresh name per test) and canary-2. */
function configOf(tag: string, model: string, weight: number): string {
  return JSON.stringify({
    models: [{ id: model, max_model_len: 32768 }],
    regions: [
      {
        id: `canary-${tag}`,
        origins: [
          { id: `canary-1@${tag}`, url: originUrl("canary-1") },
          { id: `canary-2@${tag}`, url: originUrl("canary-2") },
        ],
      },
    ],
    default_region: `canary-${tag}`,
    batching: { enabled: false, origin_quarantine_ms: 0 },
    breakers: { enabled: false },
    canaries: [{ model, origins: [`canary-1@${tag}`], weight, min_requests: 5 }],
  });
}

const send = sendWith;
const admin = adminRequest;

async function canary(config: string, model: string): Promise<CanaryView | undefined> {
  const res = await send(config, admin("/admin/canaries"));
  const { data } = await res.json<{ data: CanaryView[] }>();
  return data.find((view) => view.model === model);
}

const chat = () => edgeRequest("/v1/chat/completions", { body: chatBody({ max_tokens: 3 }) });

// The model is the simulated one under an alias-free id the origins serve.
const MODEL = "warmgate-sim-8b";

afterEach(async () => {
  await setFaults("canary-1", null);
});

describe("a canary", () => {
  it("worse than its baseline is rolled back, and its clients never see its errors", async () => {
    const config = configOf("bad", MODEL, 0.5);
    await setFaults("canary-1", { errorRate: 1, errorStatuses: [500] });
    for (let i = 0; i < 40; i++) {
      const res = await send(config, chat());
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("canary-2@bad");
    }
    const view = await canary(config, MODEL);
    expect(view).toMatchObject({ state: "rolled_back", weight: 0, origins: ["canary-1@bad"] });
    expect(view?.reason).toMatch(/^error rate/);
    expect(view?.arms.canary.errors).toBeGreaterThanOrEqual(5);
    expect(view?.arms.baseline.error_rate).toBe(0);
    // Rolled back: no request is tried on the canary any more.
    for (let i = 0; i < 10; i++) {
      const res = await send(config, chat());
      expect(res.headers.get("x-warmgate-attempts")).toBe("1");
    }
  });

  it("at its connection cap is busy, not worse: its refusals count against it not at all", async () => {
    // capped-1 refuses every connection 503 with retry-after (test/support/origins-setup.ts).
    const capped = JSON.parse(configOf("capped", MODEL, 0.5)) as Record<string, unknown> & {
      regions: { origins: { url: string }[] }[];
    };
    capped.regions[0]!.origins[0]!.url = originUrl("capped-1");
    // Under the default retry budget (10 retries and 10% of requests): once refused, the
    // canary arm waits out the retry-after on the baseline instead of spending a retry on
    // each request (before, half of the 40 were retried and those past the budget got 503).
    const config = JSON.stringify(capped);
    for (let i = 0; i < 40; i++) {
      const res = await send(config, chat());
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe("canary-2@capped");
    }
    let view = await canary(config, MODEL);
    for (let tries = 0; tries < 40 && (view?.arms.baseline.requests ?? 0) < 40; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      view = await canary(config, MODEL);
    }
    expect(view).toMatchObject({ state: "running", weight: 0.5 });
    expect(view?.arms.baseline.requests).toBe(40);
    expect(view?.arms.canary).toMatchObject({ requests: 0, errors: 0 });
  });

  it("is promoted, paused, resumed and rolled back by an operator", async () => {
    const config = configOf("ops", MODEL, 0.2);
    const path = `/admin/canaries/${MODEL}`;
    const promoted = await send(config, admin(path, { action: "promote" }));
    expect(await promoted.json()).toMatchObject({ state: "promoted", weight: 1 });
    const paused = await send(config, admin(path, { action: "pause" }));
    expect(await paused.json()).toMatchObject({ state: "paused", weight: 0 });
    const resumed = await send(config, admin(path, { action: "resume" }));
    expect(await resumed.json()).toMatchObject({ state: "running", weight: 0.2 });
    const back = await send(config, admin(path, { action: "rollback" }));
    expect(await back.json()).toMatchObject({ state: "rolled_back", weight: 0 });
  });

  it("counts every request's outcome soon after the last one, with no request after it", async () => {
    const config = configOf("quiet", MODEL, 0.5);
    for (let i = 0; i < 12; i++) expect((await send(config, chat())).status).toBe(200);
    let counted = 0;
    for (let tries = 0; tries < 40 && counted < 12; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      const view = await canary(config, MODEL);
      counted = (view?.arms.canary.requests ?? 0) + (view?.arms.baseline.requests ?? 0);
    }
    expect(counted).toBe(12);
  });

  it("starts afresh on resume: outcomes from before it that arrive after it are left out", async () => {
    const config = configOf("resume", MODEL, 0.5);
    const path = `/admin/canaries/${MODEL}`;
    // The first request's outcome is sent at once; the next ones wait their flush.
    for (let i = 0; i < 6; i++) expect((await send(config, chat())).status).toBe(200);
    expect(await (await send(config, admin(path, { action: "resume" }))).json()).toMatchObject({
      arms: { canary: { requests: 0 }, baseline: { requests: 0 } },
    });
    // Past the isolate's refresh: the next request sends what is pending and learns of the
    // resume; only the 4 requests after it count.
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    for (let i = 0; i < 4; i++) expect((await send(config, chat())).status).toBe(200);
    let view = await canary(config, MODEL);
    for (let tries = 0; tries < 20; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      view = await canary(config, MODEL);
    }
    expect((view?.arms.canary.requests ?? 0) + (view?.arms.baseline.requests ?? 0)).toBe(4);
  });

  it("refuses an unknown model and a bad action with OpenAI errors", async () => {
    const config = configOf("refusals", MODEL, 0.2);
    const unknown = await send(config, admin("/admin/canaries/nope", { action: "pause" }));
    expect(unknown.status).toBe(404);
    expect((await unknown.json<ErrorBody>()).error.code).toBe("canary_not_found");
    const bad = await send(config, admin(`/admin/canaries/${MODEL}`, { action: "explode" }));
    expect(bad.status).toBe(400);
    expect((await bad.json<ErrorBody>()).error.param).toBe("action");
  });
});
