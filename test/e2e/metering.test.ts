import { describe, expect, it } from "vitest";
import { createKey } from "../../scripts/stack.ts";
import { twoRegionStack } from "../support/two-regions.ts";
import { metricValue, usdPicos } from "../support/edge-requests.ts";
import { inParallel } from "../support/in-parallel.ts";

// Through the real edge (wrangler dev, batcher, key accounts) and simulated origins at a
// realistic pace, so a stream is still running when its client goes away.
const suite = twoRegionStack({ seed: 3, timeScale: 1 });

type RequestRecord = {
  id: string;
  status: string;
  outcome: string;
  cost_usd: number;
  completion_tokens: number | null;
};
type UsageReport = { total: { requests: number; cost_usd: number } };

async function completion(
  key: string,
  body: Record<string, unknown>,
  options: { region?: string; cancelAfterChunks?: number } = {},
): Promise<{ id: string; status: number; costHeader: string | null }> {
  const res = await fetch(`${suite.stack.edgeUrl}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${key}`,
      "content-type": "application/json",
      "x-warmgate-region": options.region ?? "eu",
    },
    body: JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "Tell me about tides." }],
      ...body,
    }),
  });
  const id = res.headers.get("x-request-id") ?? "";
  if (options.cancelAfterChunks !== undefined && res.body !== null) {
    const reader = res.body.getReader();
    for (let i = 0; i < options.cancelAfterChunks; i++) await reader.read();
    await reader.cancel();
  } else {
    await res.arrayBuffer().catch(() => null);
  }
  return { id, status: res.status, costHeader: res.headers.get("x-warmgate-cost-usd") };
}

async function get<T>(key: string, path: string): Promise<T> {
  const res = await fetch(`${suite.stack.edgeUrl}${path}`, {
    headers: { authorization: `Bearer ${key}` },
  });
  return (await res.json()) as T;
}

/** The request's record once settled (settling runs after the response, off its path). */
async function settledRecord(key: string, id: string): Promise<RequestRecord> {
  for (let i = 0; i < 1_000; i++) {
    const record = await get<RequestRecord>(key, `/v1/usage/requests/${id}`);
    // A request whose client left, or whose origin was slow to say what it generated, is
    // `expired` until its bill is known (its account asks the origins again): not settled yet.
    if (record.status === "settled" && record.id === id) return record;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`request ${id} was never settled`);
}

describe("metering through the whole stack", () => {
  it("bills hundreds of mixed requests once each, and their costs add up to the key's totals", async () => {
    const key = await createKey(suite.stack.edgeUrl, suite.stack.adminToken, {
      name: "conservation",
      allow_region_override: true,
    });
    await fetch(`${suite.euOrigin}/admin/faults`, {
      method: "PUT",
      headers: { "content-type": "application/json", ...suite.originAdmin() },
      body: JSON.stringify({
        errorRate: 0.1,
        errorStatuses: [500, 503],
        dropAfterTokens: 3,
        dropRate: 0.2,
      }),
    }).then((r) => r.arrayBuffer());
    const results = await inParallel(300, 12, (i) => {
      const region = i % 3 === 0 ? "us" : "eu";
      switch (i % 6) {
        case 0:
          return completion(key, { max_tokens: 8 + (i % 7) }, { region });
        case 1:
          return completion(key, { stream: true, max_tokens: 12 }, { region });
        case 2:
          return completion(
            key,
            { stream: true, max_tokens: 1_500 },
            { region, cancelAfterChunks: 3 },
          );
        case 3:
          return completion(key, { model: "fast", max_tokens: 10 }, { region });
        case 4:
          return completion(
            key,
            { stream: true, stream_options: { include_usage: true }, max_tokens: 9 },
            { region },
          );
        default:
          return completion(key, { model: "warmgate-sim-70b", max_tokens: 6 }, { region });
      }
    });
    const ids = results.map((r) => r.id);
    expect(new Set(ids).size).toBe(300);
    // The origin failed some of them (the edge moved those to another region, or cut
    // their streams); every one was admitted and is in the ledger.
    const metrics = await (
      await fetch(`${suite.euOrigin}/metrics`, { headers: suite.originAdmin() })
    ).text();
    for (const kind of ["error", "drop"]) {
      expect(
        metricValue(metrics, "warmgate_origin_fault_injections_total", `kind="${kind}"`),
      ).toBeGreaterThan(0);
    }
    const records = await inParallel(300, 16, (i) => settledRecord(key, ids[i] ?? ""));
    expect(records.map((r) => r.id)).toEqual(ids);
    expect(records.every((r) => r.status === "settled")).toBe(true);
    // JSON answers said what the ledger billed.
    const headers = results.flatMap((result, i) =>
      result.costHeader === null
        ? []
        : [[usdPicos(Number(result.costHeader)), usdPicos(records[i]?.cost_usd ?? -1)]],
    );
    expect(headers.length).toBeGreaterThan(0);
    expect(headers.map(([header]) => header)).toEqual(headers.map(([, ledger]) => ledger));
    // Cancelled streams were billed for what they generated before the client left.
    // Every one the client cut (not one the origin's injected drop failed first), batched
    // or not, through a real disconnect.
    const cancelled = records.filter((r, i) => i % 6 === 2 && r.outcome === "cancelled");
    expect(cancelled.length).toBeGreaterThan(20);
    expect(cancelled.filter((r) => !((r.completion_tokens ?? 0) > 0 && r.cost_usd > 0))).toEqual(
      [],
    );
    const sum = records.reduce((total, r) => total + usdPicos(r.cost_usd), 0n);
    const report = await get<UsageReport>(key, "/v1/usage");
    expect(report.total.requests).toBe(300);
    expect(usdPicos(report.total.cost_usd)).toBe(sum);
  }, 240_000);

  it("never lets many concurrent requests together overdraw a small daily budget", async () => {
    const key = await createKey(suite.stack.edgeUrl, suite.stack.adminToken, {
      name: "budget",
      budgets: [{ period: "1d", max_usd: 0.0003 }],
      allow_region_override: true,
    });
    const results = await inParallel(80, 40, () => completion(key, { max_tokens: 60 }));
    const statuses = results.map((r) => r.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(0);
    expect(statuses.filter((s) => s === 429).length).toBeGreaterThan(0);
    expect(statuses.every((s) => s === 200 || s === 429)).toBe(true);
    const admitted = results.filter((r) => r.status === 200);
    const records = await Promise.all(admitted.map((r) => settledRecord(key, r.id)));
    const spent = records.reduce((total, r) => total + usdPicos(r.cost_usd), 0n);
    expect(spent).toBeGreaterThan(0n);
    expect(spent).toBeLessThanOrEqual(300_000_000n); // $0.0003 in pico-dollars
    const report = await get<UsageReport>(key, "/v1/usage");
    expect(usdPicos(report.total.cost_usd)).toBe(spent);
  }, 120_000);
});
