import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { fileKey } from "../../../contracts/batch-files.ts";
import { ADMIN, createKey, createTeam } from "../../support/admin-keys.workers.ts";
import { batchCreateBody, EDGE, chatBody } from "../../support/edge-requests.ts";
import { pricedConfig } from "../../support/metering.workers.ts";
import { sendWith } from "../../support/test-origins.workers.ts";

// A batch's key decides what it may run, for as long as it runs: its models (and its team's)
// when it is created, its status and models at each charge of its lines.

// The slow metering origin alone, two lines at a time: a batch of 40 takes seconds.
const SLOW = JSON.stringify({
  ...(JSON.parse(pricedConfig()) as Record<string, unknown>),
  default_region: "metering-slow",
  batch_api: { lines_in_flight: 2 },
});
const PRICED = pricedConfig();

type Batch = {
  id: string;
  status: string;
  error_file_id: string | null;
  errors: { data: { code: string }[] } | null;
  request_counts: { total: number; completed: number; failed: number };
};

function lines(count: number, model = "warmgate-sim-8b"): string {
  return Array.from({ length: count }, (_, i) =>
    JSON.stringify({
      custom_id: `l${String(i).padStart(3, "0")}`,
      method: "POST",
      url: "/v1/chat/completions",
      body: chatBody({ model, max_tokens: 4 }),
    }),
  ).join("\n");
}

async function call(config: string, key: string, path: string, init: RequestInit = {}) {
  const headers = new Headers(init.headers);
  headers.set("authorization", `Bearer ${key}`);
  return sendWith(config, new Request(`${EDGE}${path}`, { ...init, headers }));
}

/** Uploads `text` and creates a batch of it for `key`; the create call's answer. */
async function batchOf(config: string, key: string, text: string): Promise<Response> {
  const form = new FormData();
  form.set("purpose", "batch");
  form.set("file", new File([text], "input.jsonl", { type: "application/jsonl" }));
  const file = await (
    await call(config, key, "/v1/files", { method: "POST", body: form })
  ).json<{
    id: string;
  }>();
  return call(config, key, "/v1/batches", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: batchCreateBody(file.id),
  });
}

/** The batch as its object holds it, once it ended (its key may no longer read it). */
async function ended(batchId: string, keyId: string): Promise<Batch> {
  for (;;) {
    const batch = (await env.BATCH_RUN.getByName(batchId).get(keyId)) as Batch | null;
    if (batch !== null && ["completed", "failed", "expired", "cancelled"].includes(batch.status)) {
      return batch;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function admin(path: string, method: string): Promise<void> {
  const res = await exports.default.fetch(`http://edge.test/admin${path}`, {
    method,
    headers: ADMIN,
  });
  expect(res.status).toBeLessThan(300);
}

describe("a batch and its key", () => {
  it("refuses a batch of a model the key may not use", async () => {
    const { key } = await createKey({ name: "only-70b", models: ["warmgate-sim-70b"] });
    const res = await batchOf(PRICED, key, lines(1));
    expect(res.status).toBe(403);
    expect(await res.json()).toMatchObject({
      error: { code: "model_not_allowed", type: "invalid_request_error" },
    });
    expect((await batchOf(PRICED, key, lines(1, "warmgate-sim-70b"))).status).toBe(200);
  });

  it("refuses a batch of a model the key's team may not use", async () => {
    const team = await createTeam({ name: "team-70b", models: ["warmgate-sim-70b"] });
    const { key } = await createKey({ name: "member", team_id: team.id });
    const res = await batchOf(PRICED, key, lines(1));
    expect(res.status).toBe(403);
    expect(await res.json()).toMatchObject({ error: { code: "model_not_allowed" } });
  });

  for (const [how, path, method, code] of [
    ["revoked", "", "DELETE", "key_revoked"],
    ["blocked", "/block", "POST", "key_blocked"],
  ] as const) {
    it(`stops a running batch whose key is ${how}: no line starts after it`, async () => {
      const { id, key } = await createKey({ name: `batch-${how}` });
      const created = await (await batchOf(SLOW, key, lines(40))).json<Batch>();
      expect(created.status).toBe("in_progress");
      await admin(`/keys/${id}${path}`, method);
      const batch = await ended(created.id, id);
      expect(batch.status).toBe("cancelled");
      expect(batch.errors?.data).toEqual([expect.objectContaining({ code })]);
      const { completed, failed, total } = batch.request_counts;
      expect(total).toBe(40);
      expect(completed + failed).toBe(40);
      // Only lines sent before the account's first answer ran: at most two at a time.
      expect(completed).toBeLessThanOrEqual(4);
      const errors = await (await env.FILES.get(fileKey(batch.error_file_id ?? "")))?.text();
      expect(errors?.split("\n").filter((l) => l.includes(`"code":"${code}"`)).length).toBe(failed);
    });
  }

  it("counts a batch's lines in the key's metrics: requests, tokens and spend", async () => {
    const { id, key } = await createKey({ name: "batch-metrics" });
    const created = await (await batchOf(PRICED, key, lines(3))).json<Batch>();
    expect((await ended(created.id, id)).request_counts.completed).toBe(3);
    const usage = await (
      await call(PRICED, key, "/v1/usage")
    ).json<{
      total: { requests: number; cost_usd: number; completion_tokens: number };
    }>();
    const { series } = await env.KEY_ACCOUNT.getByName(id).metrics();
    const sum = (pick: (s: (typeof series)[number]) => number) =>
      series.reduce((total, s) => total + pick(s), 0);
    expect(sum((s) => s.requests)).toBe(3);
    expect(sum((s) => s.completionTokens)).toBe(usage.total.completion_tokens);
    expect(sum((s) => s.spendPicos) / 1e12).toBeCloseTo(usage.total.cost_usd, 12);
    expect(series.map((s) => [s.model, s.region, s.statusClass])).toEqual([
      ["warmgate-sim-8b", "metering", "2xx"],
    ]);
  });
});
