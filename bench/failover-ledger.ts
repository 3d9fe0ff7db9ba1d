/**
 * Which origins a failed request of `npm run bench:failover` was tried at
 * (docs/benchmarks.md, "Failover"): an error answer names no origin, but the key's ledger
 * lists every attempt (`GET /v1/usage/requests/{id}`).
 */
import { setTimeout as sleep } from "node:timers/promises";

/** A failed request, by its `x-request-id`, and the second whose count it adds to. */
export interface FailedRequest {
  requestId: string;
  count: () => void;
}

async function attemptsOf(edgeUrl: string, key: string, id: string) {
  const res = await fetch(`${edgeUrl}/v1/usage/requests/${id}`, {
    headers: { authorization: `Bearer ${key}` },
  }).catch(() => null);
  if (res?.status !== 200) {
    await res?.arrayBuffer();
    return null;
  }
  const record = (await res.json()) as { attempts?: { origin: string | null }[] };
  return record.attempts ?? [];
}

/**
 * Calls `count` for each failed request the ledger shows tried at `origin`; answers how
 * many had no record (looked up again once, 3 s later, as settling runs after answers).
 */
export async function countTriedAt(
  edgeUrl: string,
  key: string,
  origin: string,
  failed: readonly FailedRequest[],
): Promise<number> {
  let pending = [...failed];
  for (const waitMs of [1_000, 3_000]) {
    await sleep(waitMs);
    const missing: FailedRequest[] = [];
    // A few lookups at a time: the edge is the one being measured, and stays up for them.
    for (let i = 0; i < pending.length; i += 8) {
      const batch = pending.slice(i, i + 8);
      const found = await Promise.all(batch.map((f) => attemptsOf(edgeUrl, key, f.requestId)));
      found.forEach((attempts, j) => {
        const request = batch[j];
        if (request === undefined) return;
        if (attempts === null) missing.push(request);
        else if (attempts.some((a) => a.origin === origin)) request.count();
      });
    }
    pending = missing;
    if (pending.length === 0) break;
  }
  return pending.length;
}
