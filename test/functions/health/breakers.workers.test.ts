import { afterEach, describe, expect, it } from "vitest";
import type { BreakerView } from "../../../contracts/breaker.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import {
  adminRequest,
  injected,
  originUrl,
  sendWith,
  setFaults,
} from "../../support/test-origins.workers.ts";

// breaker-1 and breaker-2 are this file's alone.

/**
 * A config with `sick` alone in the first region and `well` in the second, each under a
 * fresh name (`breaker-1@<tag>`), so breaker state never leaks between tests.
 */
function configOf(
  tag: string,
  batching: boolean,
  breakers: Record<string, unknown> = {},
  firstByteTimeoutMs = 5_000,
  sickId = "breaker-1",
) {
  const origin = (id: string) => ({ id: `${id}@${tag}`, url: originUrl(id) });
  return JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
    regions: [
      { id: `sick-${tag}`, origins: [origin(sickId)] },
      { id: `well-${tag}`, origins: [origin("breaker-2")] },
    ],
    default_region: `sick-${tag}`,
    // The isolate's retry budget is shared with every test before: a floor of its own.
    limits: { first_byte_timeout_ms: firstByteTimeoutMs, retry_budget: 2, retry_floor: 10_000 },
    batching: { enabled: batching, origin_quarantine_ms: 0 },
    breakers: { consecutive_failures: 3, cooldown_ms: 400, probes: 1, ...breakers },
  });
}

const admin = adminRequest;

/** The configs the running test used: their breakers are closed after it (see `afterEach`). */
const used = new Set<string>();

function send(config: string, request: Request, background?: Promise<void>[]): Promise<Response> {
  used.add(config);
  return sendWith(config, request, {}, background);
}

/** Forces a breaker open or closed. */
async function force(config: string, origin: string, state: "open" | "closed") {
  const res = await send(config, admin(`/admin/breakers/${origin}`, { state }));
  expect(res.status).toBe(200);
  return res.json<BreakerView>();
}

async function breakerOf(config: string, origin: string): Promise<BreakerView | undefined> {
  const res = await send(config, admin("/admin/breakers"));
  expect(res.status).toBe(200);
  const { data } = await res.json<{ data: BreakerView[] }>();
  return data.find((view) => view.origin === origin);
}

async function until<T>(probe: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  let value = await probe();
  for (let i = 0; i < 100 && !done(value); i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    value = await probe();
  }
  return value;
}

// An earlier test's open breaker would go on probing its origin (these same servers) with
// real completions, and see the next test's faults: each test closes the breakers it left.
afterEach(async () => {
  await Promise.all(["breaker-1", "breaker-2", "breaker-3"].map((id) => setFaults(id, null)));
  for (const config of used) {
    const res = await sendWith(config, admin("/admin/breakers"));
    const { data } = await res.json<{ data: BreakerView[] }>();
    for (const view of data.filter((v) => v.state !== "closed")) {
      const closed = await sendWith(
        config,
        admin(`/admin/breakers/${view.origin}`, { state: "closed" }),
      );
      if (closed.status !== 200) throw new Error(`closing ${view.origin}: ${closed.status}`);
    }
  }
  used.clear();
});

for (const batching of [false, true]) {
  const path = batching ? "through the Batcher" : "straight to origins";
  describe(`a dead origin, ${path}`, () => {
    it("is left after 3 failures, and probed back once its cooldown has passed", async () => {
      const tag = `dead-${batching}`;
      const config = configOf(tag, batching);
      const sick = `breaker-1@${tag}`;
      await setFaults("breaker-1", { errorRate: 1, errorStatuses: [500] });
      const before = await injected("breaker-1", "error");
      const served: string[] = [];
      let tried = 0;
      // Back to back: their bills settle meanwhile.
      const background: Promise<void>[] = [];
      for (let i = 0; i < 12; i++) {
        const request = edgeRequest("/v1/chat/completions", { body: chatBody() });
        const res = await send(config, request, background);
        expect(res.status).toBe(200);
        served.push(res.headers.get("x-warmgate-origin") ?? "");
        // Attempts before the one that served it: each failed on the sick origin.
        tried += Number(res.headers.get("x-warmgate-attempts")) - 1;
      }
      await Promise.all(background);
      // Every request was answered by the healthy region; the sick origin saw at most the
      // failures that open its breaker, and one more that was in flight as it opened. Its
      // own count may be higher: on a slow host the 12 outlast the 400 ms cooldown, and the
      // half-open probe, which completes a real token, fails there too.
      expect(new Set(served)).toEqual(new Set([`breaker-2@${tag}`]));
      expect(tried).toBeGreaterThanOrEqual(3);
      expect(tried).toBeLessThanOrEqual(4);
      const failures = (await injected("breaker-1", "error")) - before;
      expect(failures).toBeGreaterThanOrEqual(tried);
      const open = await breakerOf(config, sick);
      // Open, or half-open for a probe already (its cooldown is 400 ms); its probes
      // complete a real token, so one while it still fails opens it again.
      expect(open?.region).toBe(`sick-${tag}`);
      expect(["open", "half_open"]).toContain(open?.state);
      expect(open?.opened_count).toBeGreaterThanOrEqual(1);

      // It recovers: the breaker half-opens after 400 ms, its probe of /health succeeds.
      await setFaults("breaker-1", null);
      const closed = await until(
        () => breakerOf(config, sick),
        (view) => view?.state === "closed",
      );
      expect(closed?.state).toBe("closed");
      const back = await until(
        () => send(config, edgeRequest("/v1/chat/completions", { body: chatBody() })),
        (res) => res.headers.get("x-warmgate-origin") === sick,
      );
      expect(back.headers.get("x-warmgate-origin")).toBe(sick);
    });
  });
}

for (const batching of [false, true]) {
  const path = batching ? "through the Batcher" : "straight to origins";
  describe(`an origin at its connection cap, ${path}`, () => {
    // capped-1 answers every connection 503 with retry-after: busy, not sick.
    it("is left until its retry-after and never counted sick, however often it is asked", async () => {
      const tag = `capped-${batching}`;
      const config = configOf(tag, batching, {}, 5_000, "capped-1");
      const served: string[] = [];
      for (let i = 0; i < 8; i++) {
        const res = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
        expect(res.status).toBe(200);
        served.push(res.headers.get("x-warmgate-origin") ?? "");
        // Past its retry-after now and then: the edge asks it again.
        if (i % 3 === 2) await new Promise((resolve) => setTimeout(resolve, 1_100));
      }
      expect(new Set(served)).toEqual(new Set([`breaker-2@${tag}`]));
      const view = await breakerOf(config, `capped-1@${tag}`);
      expect(view).toMatchObject({ state: "closed", opened_count: 0 });
    });

    it("alone, has its client told to retry after its retry-after; the attempt reads busy", async () => {
      const tag = `capped-alone-${batching}`;
      const config = JSON.stringify({
        ...JSON.parse(configOf(tag, batching, {}, 5_000, "capped-1")),
        regions: [
          { id: `sick-${tag}`, origins: [{ id: `capped-1@${tag}`, url: originUrl("capped-1") }] },
        ],
      });
      const { key } = await createKey({ name: tag });
      const auth = { authorization: `Bearer ${key}` };
      for (let i = 0; i < 4; i++) {
        const res = await send(
          config,
          edgeRequest("/v1/chat/completions", { body: chatBody(), headers: auth }),
        );
        expect(res.status).toBe(503);
        expect(res.headers.get("retry-after")).toBe("1");
        expect((await res.json<ErrorBody>()).error.code).toBe("no_healthy_origin");
        const id = res.headers.get("x-request-id") ?? "";
        const record = await until(
          () => send(config, edgeRequest(`/v1/usage/requests/${id}`, { headers: auth })),
          (r) => r.status === 200,
        );
        expect((await record.json<{ attempts: unknown[] }>()).attempts).toEqual([
          { region: `sick-${tag}`, origin: `capped-1@${tag}`, result: "busy" },
        ]);
      }
      const view = await breakerOf(config, `capped-1@${tag}`);
      expect(view).toMatchObject({ state: "closed", opened_count: 0 });
    });
  });
}

describe("a frozen origin", () => {
  // A first-byte timeout of 30 s: a request that waited it would outlast the test's limit.
  it("is found by its slow first bytes, long before the first-byte timeout", async () => {
    const tag = "frozen";
    // One late call is one observation, however many items it carries. A cooldown longer
    // than the test: the breaker is read open however slowly the host runs it.
    const config = configOf(
      tag,
      true,
      { slow_first_byte_ms: 200, consecutive_failures: 1, cooldown_ms: 60_000 },
      30_000,
    );
    await setFaults("breaker-1", { hangRate: 1 });
    const before = await injected("breaker-1", "hang");
    const stream = () =>
      send(config, edgeRequest("/v1/chat/completions", { body: chatBody({ stream: true }) }));
    // Three at once hang there; their slow HEADs open the breaker, and the Batcher gives
    // them up so that they are answered elsewhere.
    const first = await Promise.all([stream(), stream(), stream()]);
    for (const res of first) expect(res.status).toBe(200);
    expect((await breakerOf(config, `breaker-1@${tag}`))?.state).toBe("open");
    const rest = await Promise.all(Array.from({ length: 5 }, stream));
    for (const res of rest) {
      expect(res.headers.get("x-warmgate-origin")).toBe(`breaker-2@${tag}`);
    }
    // The three of the first wave, and at most two the edge sent there straight before it
    // heard of the trip (it hears within a second), each given up on when it did.
    expect((await injected("breaker-1", "hang")) - before).toBeLessThanOrEqual(5);
  });
});

describe.each([
  ["straight to the origin", false],
  ["through the Batcher", true],
])("a stream sent %s to an origin that lost it", (_, batching) => {
  // A first-byte timeout of 30 s, and a breaker that never opens: only the late HEAD tells.
  // The origin reports every 250 ms, so its call is never silent for 600: what gives the
  // item up is its HEAD, late while the reports show nothing queued.
  it("is tried at the next origin once its HEAD is slow_first_byte_ms late with no queue there", async () => {
    const tag = `lost-stream-${batching ? "batched" : "direct"}`;
    const config = configOf(
      tag,
      batching,
      { slow_first_byte_ms: 600, consecutive_failures: 1_000 },
      30_000,
    );
    await setFaults("breaker-1", { hangRate: 1 });
    const res = await send(
      config,
      edgeRequest("/v1/chat/completions", { body: chatBody({ stream: true }) }),
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("x-warmgate-origin")).toBe(`breaker-2@${tag}`);
    expect(res.headers.get("x-warmgate-attempts")).toBe("2");
    expect(await res.text()).toContain("[DONE]");
  });
});

describe.each([
  ["straight to the origin", false],
  ["through the Batcher", true],
])("a frozen origin asked for JSON answers, %s", (_, batching) => {
  // A JSON answer's HEAD comes with the whole answer: the origin's idle reports time it. It
  // reports every 250 ms, so its calls are never silent for 600.
  it("is found by its idle reports long before the first-byte timeout", async () => {
    const tag = `frozen-json-${batching ? "batched" : "direct"}`;
    // A cooldown longer than the test: read open, not half-open, on a slow host.
    const config = configOf(
      tag,
      batching,
      { slow_first_byte_ms: 600, consecutive_failures: 1, cooldown_ms: 60_000 },
      30_000,
    );
    await setFaults("breaker-1", { hangRate: 1 });
    const json = () => send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
    const first = await Promise.all([json(), json(), json()]);
    for (const res of first) {
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe(`breaker-2@${tag}`);
    }
    expect((await breakerOf(config, `breaker-1@${tag}`))?.state).toBe("open");
  });
});

describe("every origin of a model open", () => {
  it("answers 503 no_healthy_origin with retry-after at once", async () => {
    const tag = "all-open";
    const config = configOf(tag, true);
    for (const id of ["breaker-1", "breaker-2"]) {
      expect(await force(config, `${id}@${tag}`, "open")).toMatchObject({
        state: "open",
        forced: true,
      });
    }
    // The edge learns of it at its next sync; the next request is refused without a call.
    await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
    const res = await until(
      () => send(config, edgeRequest("/v1/chat/completions", { body: chatBody() })),
      (r) => r.status === 503,
    );
    expect(res.status).toBe(503);
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect((await res.json<ErrorBody>()).error).toMatchObject({
      type: "server_error",
      code: "no_healthy_origin",
    });

    // Forced closed, traffic returns with the very next request: a copy that says every
    // origin is open is refreshed before anything is refused.
    for (const id of ["breaker-1", "breaker-2"]) await force(config, `${id}@${tag}`, "closed");
    const served = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
    expect(served.status).toBe(200);
  });
});

describe("the breaker admin API", () => {
  it("records each forced state in the audit log", async () => {
    const config = configOf("audited", true);
    await force(config, "breaker-1@audited", "open");
    await force(config, "breaker-1@audited", "closed");
    const res = await send(config, admin("/admin/audit?target_id=breaker-1@audited"));
    const { data } = await res.json<{ data: { action: string; detail: unknown }[] }>();
    expect(data.map((entry) => [entry.action, entry.detail])).toEqual([
      ["breaker.force", { state: "closed" }],
      ["breaker.force", { state: "open" }],
    ]);
  });

  it("lists every configured origin's breaker", async () => {
    const config = configOf("list", true);
    const res = await send(config, admin("/admin/breakers"));
    const { data } = await res.json<{ data: BreakerView[] }>();
    expect(data).toEqual(
      expect.arrayContaining([
        {
          region: "sick-list",
          origin: "breaker-1@list",
          state: "closed",
          since: expect.any(Number),
          failures: 0,
          requests: 0,
          opened_count: 0,
          retry_at: null,
          forced: false,
        },
      ]),
    );
  });

  it("refuses a bad state, an unknown origin and a missing token with OpenAI errors", async () => {
    const config = configOf("refusals", true);
    const bad = await send(
      config,
      admin("/admin/breakers/breaker-1@refusals", { state: "half_open" }),
    );
    expect(bad.status).toBe(400);
    expect((await bad.json<ErrorBody>()).error).toMatchObject({
      type: "invalid_request_error",
      param: "state",
    });
    const unknown = await send(config, admin("/admin/breakers/nowhere", { state: "open" }));
    expect(unknown.status).toBe(404);
    expect((await unknown.json<ErrorBody>()).error.code).toBe("origin_not_found");
    const anonymous = await send(config, new Request("https://edge.test/admin/breakers"));
    expect(anonymous.status).toBe(401);
  });
});

describe("a request that fails on every origin it tries", () => {
  it("is the request's fault: answered 502 and counted against no origin", async () => {
    const tag = "poison";
    const config = configOf(tag, true);
    for (const id of ["breaker-1", "breaker-2"]) {
      await setFaults(id, { errorRate: 1, errorStatuses: [500] });
    }
    for (let i = 0; i < 10; i++) {
      const res = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
      expect(res.status).toBe(502);
      expect((await res.json<ErrorBody>()).error.code).toBe("origin_error");
    }
    for (const id of ["breaker-1", "breaker-2"]) {
      expect(await breakerOf(config, `${id}@${tag}`)).toMatchObject({
        state: "closed",
        failures: 0,
      });
    }
  });
});

/** breaker-1 and breaker-2 in the first region, breaker-3 alone in the second. */
function twoRegions(tag: string, batching: boolean) {
  const origin = (id: string) => ({ id: `${id}@${tag}`, url: originUrl(id) });
  return JSON.stringify({
    ...JSON.parse(configOf(tag, batching)),
    regions: [
      { id: `down-${tag}`, origins: [origin("breaker-1"), origin("breaker-2")] },
      { id: `up-${tag}`, origins: [origin("breaker-3")] },
    ],
    default_region: `down-${tag}`,
  });
}

for (const batching of [false, true]) {
  describe(`a region whose every origin fails, ${batching ? "through the Batcher" : "straight"}`, () => {
    it("is stepped over to the next region, and its origins are counted", async () => {
      const tag = `region-down-${batching}`;
      const config = twoRegions(tag, batching);
      for (const id of ["breaker-1", "breaker-2"]) {
        await setFaults(id, { errorRate: 1, errorStatuses: [500] });
      }
      const res = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe(`breaker-3@${tag}`);
      expect(res.headers.get("x-warmgate-attempts")).toBe("3");
      for (const id of ["breaker-1", "breaker-2"]) {
        const view = await until(
          () => breakerOf(config, `${id}@${tag}`),
          (v) => (v?.failures ?? 0) > 0,
        );
        expect(view?.failures).toBe(1);
      }
    });

    it("is failed over to the next region by a burst that spent the isolate's retry budget", async () => {
      const tag = `region-burst-${batching}`;
      // No retry within a region is left in the budget: failover across regions needs none.
      const config = JSON.stringify({
        ...JSON.parse(twoRegions(tag, batching)),
        limits: { first_byte_timeout_ms: 5_000, retry_budget: 2, retry_floor: 0, retry_ratio: 0 },
      });
      for (const id of ["breaker-1", "breaker-2"]) {
        await setFaults(id, { errorRate: 1, errorStatuses: [500] });
      }
      const burst = await Promise.all(
        Array.from({ length: 12 }, () =>
          send(config, edgeRequest("/v1/chat/completions", { body: chatBody() })),
        ),
      );
      for (const res of burst) {
        expect(res.status).toBe(200);
        expect(res.headers.get("x-warmgate-origin")).toBe(`breaker-3@${tag}`);
      }
    });

    it("fails a request that fails there and in the next region alike, on no origin's count", async () => {
      const tag = `region-poison-${batching}`;
      const config = twoRegions(tag, batching);
      for (const id of ["breaker-1", "breaker-2", "breaker-3"]) {
        await setFaults(id, { errorRate: 1, errorStatuses: [500] });
      }
      const res = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
      expect(res.status).toBe(502);
      expect((await res.json<ErrorBody>()).error.code).toBe("origin_error");
      for (const id of ["breaker-1", "breaker-2", "breaker-3"]) {
        expect(await breakerOf(config, `${id}@${tag}`)).toMatchObject({ failures: 0 });
      }
    });
  });
}

describe("an origin that answers 429", () => {
  it("is busy, not sick: avoided while the other serves, its breaker untouched", async () => {
    const tag = "busy";
    // Both in one region, so that the Batcher itself must step around the busy one.
    const config = JSON.stringify({
      ...JSON.parse(configOf(tag, true)),
      regions: [
        {
          id: `both-${tag}`,
          origins: ["breaker-1", "breaker-2"].map((id) => ({
            id: `${id}@${tag}`,
            url: originUrl(id),
          })),
        },
      ],
      default_region: `both-${tag}`,
    });
    await setFaults("breaker-1", { errorRate: 1, errorStatuses: [429] });
    const before = await injected("breaker-1", "error");
    const started = Date.now();
    for (let i = 0; i < 10; i++) {
      const res = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe(`breaker-2@${tag}`);
    }
    // Its retry-after (1 s) keeps it last: it saw the first request or two, and one more for
    // each second the ten took (a loaded machine's), never all ten.
    const seconds = Math.floor((Date.now() - started) / 1_000);
    expect((await injected("breaker-1", "error")) - before).toBeLessThanOrEqual(2 + seconds);
    expect(await breakerOf(config, `breaker-1@${tag}`)).toMatchObject({ state: "closed" });
  });
});

for (const batching of [false, true]) {
  describe(`an origin that cuts every stream, ${batching ? "through the Batcher" : "straight"}`, () => {
    it("has each cut counted, and its breaker opens", async () => {
      const tag = `cut-${batching}`;
      const config = configOf(tag, batching);
      await setFaults("breaker-1", { dropRate: 1, dropAfterTokens: 2 });
      const stream = chatBody({ stream: true, max_tokens: 20 });
      for (let i = 0; i < 3; i++) {
        const res = await send(config, edgeRequest("/v1/chat/completions", { body: stream }));
        expect(res.status).toBe(200);
        // Cut after its first bytes: the stream ends with an error event, not [DONE].
        const text = await res.text();
        expect(text).toContain('"error"');
        expect(text).not.toContain("[DONE]");
      }
      const view = await until(
        () => breakerOf(config, `breaker-1@${tag}`),
        (v) => v?.state === "open",
      );
      expect(view?.state).toBe("open");
    });
  });
}

describe("every origin answering 503 with retry-after", () => {
  it("is busy: the client gets 503 no_healthy_origin with retry-after, no breaker counts it", async () => {
    const tag = "all-busy";
    const config = configOf(tag, true);
    for (const id of ["breaker-1", "breaker-2"]) {
      await setFaults(id, { errorRate: 1, errorStatuses: [503] });
    }
    for (let i = 0; i < 3; i++) {
      const res = await send(config, edgeRequest("/v1/chat/completions", { body: chatBody() }));
      expect(res.status).toBe(503);
      expect(Number(res.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
      expect(Number(res.headers.get("retry-after-ms"))).toBeGreaterThanOrEqual(1_000);
      expect((await res.json<ErrorBody>()).error.code).toBe("no_healthy_origin");
    }
    for (const id of ["breaker-1", "breaker-2"]) {
      expect(await breakerOf(config, `${id}@${tag}`)).toMatchObject({
        state: "closed",
        failures: 0,
      });
    }
  });
});
