import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningStack, createKey, startStack } from "../../scripts/stack.ts";

// Two `wrangler dev` runs over the same persisted state: what the first run did to keys,
// limits and the ledger must still hold in the second.
const REGIONS = [{ id: "eu", continents: ["EU"], origins: 1 }];
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "warmgate-persist-"));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function chat(stack: RunningStack, key: string, maxTokens = 8): Promise<Response> {
  const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "Remember me." }],
      max_tokens: maxTokens,
    }),
  });
  // Read it whole (the request ends), keeping a copy for callers that want the body.
  await res.clone().arrayBuffer();
  return res;
}

type UsageReport = { total: { requests: number; cost_usd: number } };

/** The key's usage today once nothing is in flight (settling runs after the responses). */
async function usageOf(stack: RunningStack, key: string, requests: number): Promise<UsageReport> {
  for (;;) {
    const res = await fetch(`${stack.edgeUrl}/v1/usage`, {
      headers: { authorization: `Bearer ${key}` },
    });
    const report = (await res.json()) as UsageReport;
    if (report.total.requests >= requests) return report;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function admin(stack: RunningStack, path: string, method = "GET"): Promise<Response> {
  return fetch(`${stack.edgeUrl}/admin${path}`, {
    method,
    headers: { authorization: `Bearer ${stack.adminToken}` },
  });
}

describe("state across a wrangler dev restart", () => {
  it("keeps keys, revocations, rate-limit counters, the ledger and spent credit", async () => {
    let devKey: string;
    let limited: { id: string; key: string };
    let revoked: { id: string; key: string };
    let credited: { id: string; key: string };
    let billed: UsageReport;

    // Deterministic answers: the credit below is sized to what the first answer costs.
    const first = await startStack({
      regions: REGIONS,
      persistTo: dir,
      sim: { deterministic: true },
    });
    try {
      devKey = first.apiKey;
      const created = async (name: string, limits: Record<string, number> = {}) => {
        const key = await createKey(first.edgeUrl, first.adminToken, { name, limits });
        return { id: key.split("_")[1] ?? "", key };
      };
      limited = await created("one per minute", { rpm: 1 });
      revoked = await created("to revoke");
      expect((await chat(first, limited.key)).status).toBe(200);
      expect((await chat(first, revoked.key)).status).toBe(200);
      expect((await admin(first, `/keys/${revoked.id}`, "DELETE")).status).toBe(200);
      expect((await chat(first, revoked.key)).status).toBe(401);
      // Credit for one request of 64 tokens at most: the second is refused.
      credited = await created("credit");
      await fetch(`${first.edgeUrl}/admin/keys/${credited.id}`, {
        method: "PATCH",
        headers: {
          authorization: `Bearer ${first.adminToken}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({ limits: { credit_usd: 0.00004 } }),
      }).then((r) => r.arrayBuffer());
      expect((await chat(first, credited.key, 64)).status).toBe(200);
      billed = await usageOf(first, credited.key, 1);
      expect(billed.total.cost_usd).toBeGreaterThan(0);
      expect((await chat(first, credited.key, 64)).status).toBe(429);
    } finally {
      await first.stop();
    }

    const second = await startStack({
      regions: REGIONS,
      persistTo: dir,
      sim: { deterministic: true },
    });
    try {
      // The development key saved by the first run is still accepted, so it is reused.
      expect(second.apiKey).toBe(devKey);
      expect((await chat(second, devKey)).status).toBe(200);
      // Its one request of the minute was taken before the restart.
      const refused = await chat(second, limited.key);
      expect(refused.status).toBe(429);
      expect(refused.headers.get("x-ratelimit-remaining-requests")).toBe("0");
      expect((await chat(second, revoked.key)).status).toBe(401);
      const listed = (await (await admin(second, "/keys?limit=100")).json()) as {
        data: { id: string; status: string; limits: { rpm: number } }[];
      };
      expect(listed.data.find((k) => k.id === limited.id)?.limits.rpm).toBe(1);
      expect(listed.data.find((k) => k.id === revoked.id)?.status).toBe("revoked");
      // The ledger and the spent credit are still there.
      expect(await usageOf(second, credited.key, 1)).toEqual(billed);
      const spent = await chat(second, credited.key, 64);
      expect(spent.status).toBe(429);
      expect(((await spent.json()) as { error: { code: string } }).error.code).toBe(
        "insufficient_quota",
      );
    } finally {
      await second.stop();
    }
  }, 240_000);
});
