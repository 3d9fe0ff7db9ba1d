import { runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { LEASE_MS, LEASE_RENEW_MS } from "../../../functions/middleware/auth.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { settledLedgerRow } from "../../support/key-accounts.workers.ts";

async function ledgerRow(keyId: string, requestId: string) {
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(keyId));
  return runInDurableObject(stub, (account: KeyAccount, state) => {
    account.flush();
    return state.storage.sql
      .exec<{ expires_at: number; state: string }>(
        "SELECT expires_at, state FROM ledger WHERE request_id = ?",
        requestId,
      )
      .toArray()[0];
  });
}

async function leaseOf(keyId: string, requestId: string): Promise<number | null> {
  const row = await ledgerRow(keyId, requestId);
  return row?.state === "open" ? row.expires_at : null;
}

describe("the lease of a request being served", () => {
  it("is short, and renewed while a long stream runs", async () => {
    const { id, key } = await createKey({ name: "leases" });
    const started = Date.now();
    // slow-1 takes about 20 ms a token: this stream outlives a renewal.
    const res = await exports.default.fetch(
      edgeRequest("/v1/chat/completions", {
        body: chatBody({ stream: true, max_tokens: 4000, ignore_eos: true }),
        headers: { authorization: `Bearer ${key}` },
        region: "slow",
      }),
    );
    expect(res.status).toBe(200);
    const requestId = res.headers.get("x-request-id") ?? "";
    const first = await leaseOf(id, requestId);
    expect(first).not.toBeNull();
    expect(first ?? 0).toBeLessThanOrEqual(started + LEASE_MS + 1_000);
    const reader = res.body?.getReader();
    while (Date.now() < started + LEASE_RENEW_MS + 1_000) {
      const { done } = (await reader?.read()) ?? { done: true };
      if (done) throw new Error("the stream ended before a renewal");
    }
    const renewed = await leaseOf(id, requestId);
    expect(renewed ?? 0).toBeGreaterThan(first ?? 0);
    await reader?.cancel();
    // Its settlement, so that none runs past the test.
    expect((await settledLedgerRow(id, requestId, 1_000))?.state).toBe("settled");
  });
});
