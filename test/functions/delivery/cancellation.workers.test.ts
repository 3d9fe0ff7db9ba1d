import { exports } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { chatBody, edgeRequest, metricValue } from "../../support/edge-requests.ts";

// slow-1 generates at a realistic pace, so a long stream is still running when it is cancelled.
const slow = inject("testOrigins").find((origin) => origin.id === "slow-1");
if (slow === undefined) throw new Error("slow-1 is not running");

async function originMetrics(): Promise<{ inFlight: number; cancelled: number }> {
  const text = await (await fetch(`${slow?.url}/metrics`)).text();
  return {
    inFlight: metricValue(text, "warmgate_origin_items_in_flight"),
    // Through the cancel endpoint (so END still reports the usage), or by a dropped call.
    cancelled:
      metricValue(text, "warmgate_origin_cancellations_total", 'reason="cancel"') +
      metricValue(text, "warmgate_origin_cancellations_total", 'reason="client"'),
  };
}

/** Polls the origin until `done` holds (or gives up after `attempts`). */
async function waitFor(
  done: (m: { inFlight: number; cancelled: number }) => boolean,
  attempts = 200,
): Promise<{ inFlight: number; cancelled: number }> {
  let metrics = await originMetrics();
  for (let i = 0; i < attempts && !done(metrics); i++) {
    await new Promise((resolve) => setTimeout(resolve, 25));
    metrics = await originMetrics();
  }
  return metrics;
}

describe("client disconnect", () => {
  it("cancels the item on the origin and frees its slot", async () => {
    const before = await originMetrics();
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        body: chatBody({ stream: true, max_tokens: 4000 }),
        region: "slow",
      }),
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("x-warmgate-origin")).toBe("slow-1");
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    const first = await reader.read();
    expect(first.done).toBe(false);
    const running = await waitFor((m) => m.inFlight > 0);
    expect(running.inFlight).toBe(1);

    await reader.cancel();

    const after = await waitFor((m) => m.inFlight === 0 && m.cancelled > before.cancelled);
    expect(after.inFlight).toBe(0);
    expect(after.cancelled).toBe(before.cancelled + 1);
  });
});
