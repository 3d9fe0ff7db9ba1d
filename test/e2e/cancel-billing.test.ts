import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type FoundItem, type Reconciled, reconcile } from "../../contracts/outcomes.ts";
import { OutcomesResponseSchema } from "../../contracts/protocol/schema.ts";
import { type RunningStack, createKey, startStack } from "../../scripts/stack.ts";
import { inParallel } from "../support/in-parallel.ts";

// The mixed traffic of metering.test.ts, every request through the Batchers (no idle
// bypass), two origins a region and no faults: a Batcher busy with many streams may read an
// item's END long after its origin wrote it, and its client long after it went away.
let stack: RunningStack;

beforeAll(async () => {
  stack = await startStack({
    regions: [
      { id: "eu", continents: ["EU"], origins: 2 },
      { id: "us", continents: ["NA"], origins: 2 },
    ],
    sim: { seed: 5, timeScale: 1 },
    settings: { batching: { idle_bypass_ms: 0 } },
  });
}, 180_000);

afterAll(async () => {
  await stack?.stop();
});

type RequestRecord = {
  id: string;
  status: string;
  outcome: string;
  completion_tokens: number | null;
  cost_usd: number;
};

async function completion(
  key: string,
  body: Record<string, unknown>,
  region: string,
  cancelAfterChunks?: number,
): Promise<string> {
  const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${key}`,
      "content-type": "application/json",
      "x-warmgate-region": region,
    },
    body: JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "Tell me about tides." }],
      ...body,
    }),
  });
  expect(res.status).toBe(200);
  if (cancelAfterChunks !== undefined && res.body !== null) {
    const reader = res.body.getReader();
    for (let i = 0; i < cancelAfterChunks; i++) await reader.read();
    await reader.cancel();
  } else {
    await res.arrayBuffer();
  }
  return res.headers.get("x-request-id") ?? "";
}

/** The request's record once settled (settling runs after the response, off its path). */
async function settledRecord(key: string, id: string): Promise<RequestRecord> {
  for (let i = 0; i < 1_000; i++) {
    const res = await fetch(`${stack.edgeUrl}/v1/usage/requests/${id}`, {
      headers: { authorization: `Bearer ${key}` },
    });
    const record = (await res.json()) as RequestRecord;
    // A request whose client left, or whose origin was slow to say what it generated, is
    // `expired` until its bill is known (its account asks the origins again): not settled yet.
    if (record.status === "settled" && record.id === id) return record;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`request ${id} was never settled`);
}

/**
 * What the origins say each request generated, by the one billing rule (an attempt retried
 * on another origin included): the attempt that finished, else the one that generated most.
 */
async function originRecords(ids: readonly string[]): Promise<Map<string, Reconciled>> {
  const items: FoundItem[] = [];
  for (const { origin } of stack.origins) {
    const res = await fetch(`${origin.url}/v1/batch/outcomes`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.originAccessToken}` },
      body: JSON.stringify({ ids }),
    });
    const answer = OutcomesResponseSchema.parse(await res.json());
    items.push(...answer.items.map((item) => ({ ...item, origin: origin.originId })));
  }
  return reconcile(ids, items);
}

describe("billing mixed traffic through the Batchers", () => {
  it("bills every request, cancelled ones included, for exactly what its origin generated", async () => {
    const key = await createKey(stack.edgeUrl, stack.adminToken, {
      name: "batched-mix",
      allow_region_override: true,
    });
    const ids = await inParallel(300, 12, (i) => {
      const region = i % 3 === 0 ? "us" : "eu";
      switch (i % 6) {
        case 0:
          return completion(key, { max_tokens: 8 + (i % 7) }, region);
        case 1:
          return completion(key, { stream: true, max_tokens: 12 }, region);
        case 2:
          return completion(key, { stream: true, max_tokens: 1_500 }, region, 3);
        case 3:
          return completion(key, { model: "fast", max_tokens: 10 }, region);
        case 4:
          return completion(
            key,
            { stream: true, stream_options: { include_usage: true }, max_tokens: 9 },
            region,
          );
        default:
          return completion(key, { model: "warmgate-sim-70b", max_tokens: 6 }, region);
      }
    });
    const records = await inParallel(300, 16, (i) => settledRecord(key, ids[i] ?? ""));
    const generated = await originRecords(ids);
    const billed = records.map((record) => {
      const found = generated.get(record.id);
      return {
        id: record.id,
        status: record.status,
        billed: record.completion_tokens,
        generated: found?.kind === "ended" ? (found.usage?.completion_tokens ?? null) : found?.kind,
        paid: record.cost_usd > 0,
      };
    });
    const wrong = billed.filter(
      (bill) =>
        bill.status !== "settled" ||
        bill.billed !== bill.generated ||
        bill.paid !== (bill.generated !== null && bill.generated !== 0),
    );
    expect(wrong).toEqual([]);
    // The long streams were cut by their clients, and each billed for what it generated.
    const cancelled = records.filter((r, i) => i % 6 === 2 && r.outcome === "cancelled");
    expect(cancelled.length).toBeGreaterThan(20);
  }, 240_000);
});
