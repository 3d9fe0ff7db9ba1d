// The health probe's verdicts (docs/failover.md, "Probes"): a completion answered busy is
// an origin alive and full, not a sick one.
import { afterEach, describe, expect, it, vi } from "vitest";
import { probeOrigin, reachable } from "../../../durable-objects/origin-breakers/probe.ts";
import {
  BATCH_CONTENT_TYPE,
  FrameType,
  concatBytes,
  encodeJsonFrame,
} from "../../../contracts/protocol/framing.ts";

const target = { id: "a", url: "http://origin.test", probeModel: "m" };

/** Answers `/health` with 200 and the batch call with `batch`. */
function origin(batch: () => Response) {
  vi.stubGlobal("fetch", async (input: RequestInfo | URL) => {
    const url = String(input instanceof Request ? input.url : input);
    return url.endsWith("/health") ? new Response("{}") : batch();
  });
}

function items(status: number, headers: Record<string, string>, outcome: string): Response {
  const body = concatBytes([
    encodeJsonFrame(FrameType.HEAD, 0, { id: "p", status, headers }),
    encodeJsonFrame(FrameType.END, 0, {
      id: "p",
      outcome,
      usage: null,
      ...(outcome !== "ok" && { error: { message: "x", type: "server_error", code: null } }),
    }),
  ]);
  return new Response(new Blob([body as Uint8Array<ArrayBuffer>]), {
    headers: { "content-type": BATCH_CONTENT_TYPE },
  });
}

afterEach(() => {
  vi.unstubAllGlobals();
});

describe("probeOrigin", () => {
  it("passes an origin whose batch call is refused as busy, fails one refused as sick", async () => {
    origin(() => new Response("full", { status: 503, headers: { "retry-after": "1" } }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    origin(() => new Response("full", { status: 429 }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    origin(() => new Response("down", { status: 503 }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(false);
    origin(() => new Response("boom", { status: 500 }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(false);
  });

  it("passes a completion answered busy or about the probe's own request, fails an engine error", async () => {
    origin(() => items(200, {}, "ok"));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    origin(() => items(503, { "retry-after": "2" }, "error"));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    origin(() => items(429, {}, "error"));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    origin(() => items(400, {}, "error"));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    origin(() => items(500, {}, "error"));
    expect(await probeOrigin(target, {}, 1_000)).toBe(false);
    origin(() => items(503, {}, "error"));
    expect(await probeOrigin(target, {}, 1_000)).toBe(false);
  });

  it("fails an origin whose /health is not ok", async () => {
    vi.stubGlobal("fetch", async () => new Response("degraded", { status: 503 }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(false);
    vi.stubGlobal("fetch", async () => new Response("boom", { status: 500 }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(false);
  });

  it("passes an origin whose /health is refused busy (at its connection cap)", async () => {
    vi.stubGlobal(
      "fetch",
      async () => new Response("full", { status: 503, headers: { "retry-after": "1" } }),
    );
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
    expect(await probeOrigin({ id: "a", url: "http://origin.test" }, {}, 1_000)).toBe(true);
    vi.stubGlobal("fetch", async () => new Response("slow down", { status: 429 }));
    expect(await probeOrigin(target, {}, 1_000)).toBe(true);
  });
});

const refused = async () => {
  throw new TypeError("Network connection lost.");
};
const nothingThere = async () => false;
const somethingThere = async () => true;

describe("reachable", () => {
  it("is false only when /health gets no answer and nothing accepts a connection", async () => {
    vi.stubGlobal("fetch", refused);
    expect(await reachable(target, 1_000, nothingThere)).toBe(false);
  });

  it("is true for an origin that accepts and closes (far past its connection cap)", async () => {
    vi.stubGlobal("fetch", refused);
    expect(await reachable(target, 1_000, somethingThere)).toBe(true);
  });

  it("is true for any answer, a 5xx or Cloudflare's 52x included, without asking further", async () => {
    for (const status of [200, 500, 503, 521, 522]) {
      vi.stubGlobal("fetch", async () => new Response("", { status }));
      expect(await reachable(target, 1_000, nothingThere)).toBe(true);
    }
  });

  it("is true for an origin that answers nothing in time: slow is not gone", async () => {
    vi.stubGlobal(
      "fetch",
      (_input: RequestInfo | URL, init?: RequestInit) =>
        new Promise((_resolve, reject) => {
          init?.signal?.addEventListener("abort", () => reject(new Error("aborted")));
        }),
    );
    expect(await reachable(target, 50, nothingThere)).toBe(true);
  });
});
