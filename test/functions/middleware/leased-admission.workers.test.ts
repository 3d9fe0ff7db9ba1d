import {
  createExecutionContext,
  runDurableObjectAlarm,
  runInDurableObject,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { parseLeasedId } from "../../../contracts/lease-ids.ts";
import { SETTLE_LINGER_MS } from "../../../functions/accounts/settle-queue.ts";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import app from "../../../functions/index.ts";
import { ADMIN, createKey } from "../../support/admin-keys.workers.ts";
import { chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { pricedConfig } from "../../support/metering.workers.ts";

function account(id: string): DurableObjectStub<KeyAccount> {
  return env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
}

/** The bindings with every call to a key's account counted by method, in `calls`. */
function countingEnv(calls: string[]): Env {
  const namespace = env.KEY_ACCOUNT;
  const counted = new Proxy(namespace, {
    get(target, name) {
      const own: unknown = Reflect.get(target, name);
      if (name !== "get") return typeof own === "function" ? own.bind(target) : own;
      return (id: DurableObjectId) =>
        new Proxy(target.get(id), {
          get(stub, method) {
            const value: unknown = Reflect.get(stub, method);
            if (typeof value !== "function" || typeof method !== "string" || method === "then") {
              return value;
            }
            return (...args: unknown[]) => {
              calls.push(method);
              return Reflect.apply(value, stub, args);
            };
          },
        });
    },
  });
  return { ...env, KEY_ACCOUNT: counted };
}

async function send(
  bindings: Env,
  key: string,
  overrides: Record<string, unknown> = {},
  region = "eu",
  /** Given, the request's background work (its settlement) is left here to wait for. */
  background?: Promise<void>[],
) {
  const ctx = createExecutionContext();
  const request = edgeRequest("/v1/chat/completions", {
    body: chatBody(overrides),
    headers: { authorization: `Bearer ${key}` },
    region,
  });
  const response = await app.fetch(request, bindings, ctx);
  const text = await response.text();
  if (background === undefined) await waitOnExecutionContext(ctx);
  else background.push(waitOnExecutionContext(ctx));
  return { response, text };
}

/** The key's spend as its account holds it (pico-dollars): settled and reserved. */
async function spendOf(id: string) {
  return runInDurableObject(account(id), (instance: KeyAccount, state) => {
    instance.flush();
    const row = state.storage.sql
      .exec<{ s: number; sp: number; r: number; rp: number }>(
        "SELECT settled_micros AS s, settled_picos AS sp, reserved_micros AS r, reserved_picos AS rp FROM spend WHERE period = 'all'",
      )
      .toArray()[0];
    return {
      settled: BigInt(row?.s ?? 0) * 1_000_000n + BigInt(row?.sp ?? 0),
      reserved: BigInt(row?.r ?? 0) * 1_000_000n + BigInt(row?.rp ?? 0),
    };
  });
}

describe("a key with headroom", () => {
  it("is admitted under the isolate's lease, with no call to its account before the origin", async () => {
    const { key } = await createKey({ name: "leased" });
    const calls: string[] = [];
    const bindings = countingEnv(calls);
    // The first request is admitted exactly; its answer grants the isolate a lease.
    const first = await send(bindings, key);
    expect(first.response.status).toBe(200);
    expect(calls.filter((call) => call === "admit")).toHaveLength(1);
    for (let i = 0; i < 3; i++) {
      const before = calls.length;
      const { response } = await send(bindings, key);
      expect(response.status).toBe(200);
      expect(parseLeasedId(response.headers.get("x-request-id") ?? "")).not.toBeNull();
      // Whatever the account heard of after the answer (settlements, renewals), no admit.
      expect(calls.slice(before)).not.toContain("admit");
    }
    expect(calls.filter((call) => call === "admit")).toHaveLength(1);
  });

  it("bills a leased request exactly once, in a ledger row of its own", async () => {
    const { id, key } = await createKey({ name: "leased-billing" });
    await send(env, key);
    const { response, text } = await send(env, key);
    const requestId = response.headers.get("x-request-id") ?? "";
    expect(parseLeasedId(requestId)).not.toBeNull();
    const usage = (JSON.parse(text) as { usage: { total_tokens: number } }).usage;
    let record: { status?: string; total_tokens?: number } = {};
    for (let i = 0; i < 200 && record.status !== "settled"; i++) {
      const res = await exports.default.fetch(`http://edge.test/v1/usage/requests/${requestId}`, {
        headers: { authorization: `Bearer ${key}` },
      });
      record = await res.json();
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect(record.status).toBe("settled");
    expect(record.total_tokens).toBe(usage.total_tokens);
    const rows = await runInDurableObject(account(id), (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ n: number }>("SELECT COUNT(*) AS n FROM ledger WHERE request_id = ?", requestId)
        .one().n;
    });
    expect(rows).toBe(1);
  });
});

describe("a leased key's bills at one client's pace", () => {
  it("share a call to the account when they end tens of milliseconds apart", async () => {
    const { key } = await createKey({ name: "leased-paced" });
    const calls: string[] = [];
    const bindings = countingEnv(calls);
    await send(bindings, key);
    const before = calls.length;
    const background: Promise<void>[] = [];
    const ended: number[] = [];
    for (let i = 0; i < 4; i++) {
      const { response } = await send(bindings, key, {}, "eu", background);
      expect(parseLeasedId(response.headers.get("x-request-id") ?? "")).not.toBeNull();
      ended.push(Date.now());
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    await Promise.all(background);
    // Four bills 25 ms and more apart, each of which would wait 20 ms alone: one call
    // carries every bill that ends within a lingering wait of the call's first.
    const span = (ended.at(-1) ?? 0) - (ended[0] ?? 0);
    const settles = calls.slice(before).filter((call) => call === "settleMany");
    expect(settles.length).toBeGreaterThanOrEqual(1);
    expect(settles.length).toBeLessThanOrEqual(1 + Math.floor(span / SETTLE_LINGER_MS));
  });
});

describe("a leased request's usage record", () => {
  it("is found by its key in the isolate that answered it as soon as the answer is read", async () => {
    const { key } = await createKey({ name: "leased-read" });
    await send(env, key);
    const ctx = createExecutionContext();
    const request = edgeRequest("/v1/chat/completions", {
      body: chatBody(),
      headers: { authorization: `Bearer ${key}` },
      region: "eu",
    });
    const response = await app.fetch(request, env, ctx);
    const { usage } = JSON.parse(await response.text()) as { usage: { total_tokens: number } };
    const requestId = response.headers.get("x-request-id") ?? "";
    expect(parseLeasedId(requestId)).not.toBeNull();
    // Read before the settlement's own timer sent it (the context is still running).
    const read = await app.fetch(
      edgeRequest(`/v1/usage/requests/${requestId}`, {
        method: "GET",
        headers: { authorization: `Bearer ${key}` },
      }),
      env,
      createExecutionContext(),
    );
    expect(read.status).toBe(200);
    expect(await read.json()).toMatchObject({
      status: "settled",
      total_tokens: usage.total_tokens,
    });
    await waitOnExecutionContext(ctx);
  });
});

describe("a key's budget under leases", () => {
  it("is never exceeded by many concurrent requests", async () => {
    // About twenty worst cases fit the credit.
    const { id, key } = await createKey({ name: "leased-budget", limits: { credit_usd: 0.0005 } });
    const priced = { ...env, WARMGATE_CONFIG: pricedConfig() };
    await send(priced, key, { max_tokens: 64 }, "metering");
    const answers = await Promise.all(
      Array.from({ length: 60 }, () => send(priced, key, { max_tokens: 64 }, "metering")),
    );
    const statuses = answers.map(({ response }) => response.status);
    expect(statuses.every((status) => status === 200 || status === 429)).toBe(true);
    expect(statuses).toContain(429);
    const spend = await spendOf(id);
    expect(spend.settled + spend.reserved).toBeLessThanOrEqual(500_000_000n);
  });
});

describe("a lease and its key's changes", () => {
  it("ends at once in the isolate that revokes the key", async () => {
    const { id, key } = await createKey({ name: "leased-revoke" });
    await send(env, key);
    expect((await send(env, key)).response.status).toBe(200);
    const res = await exports.default.fetch(`http://edge.test/admin/keys/${id}`, {
      method: "DELETE",
      headers: ADMIN,
    });
    expect(res.status).toBe(200);
    expect((await send(env, key)).response.status).toBe(401);
  });

  it("admits nothing once its window has passed since the key was revoked elsewhere", async () => {
    const { id, key } = await createKey({ name: "leased-revoke-far" });
    const config = JSON.parse(env.WARMGATE_CONFIG) as Record<string, unknown>;
    const bindings = {
      ...env,
      WARMGATE_CONFIG: JSON.stringify({ ...config, leases: { window_ms: 500 } }),
    };
    await send(bindings, key);
    expect((await send(bindings, key)).response.status).toBe(200);
    // Another isolate's admin call: this one's lease is not told.
    await account(id).revoke(Date.now());
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect((await send(bindings, key)).response.status).toBe(401);
  });
});

describe("a lease of a blocked key", () => {
  it("ends at once in the isolate that blocks the key, and leases again once unblocked", async () => {
    const { id, key } = await createKey({ name: "leased-block" });
    await send(env, key);
    expect((await send(env, key)).response.status).toBe(200);
    const block = await exports.default.fetch(`http://edge.test/admin/keys/${id}/block`, {
      method: "POST",
      headers: ADMIN,
    });
    expect(block.status).toBe(200);
    const refused = await send(env, key);
    expect(refused.response.status).toBe(403);
    expect(JSON.parse(refused.text)).toMatchObject({
      error: { type: "permission_error", code: "key_blocked", param: null },
    });
    const unblock = await exports.default.fetch(`http://edge.test/admin/keys/${id}/unblock`, {
      method: "POST",
      headers: ADMIN,
    });
    expect(unblock.status).toBe(200);
    expect((await send(env, key)).response.status).toBe(200);
  });

  it("admits nothing once its window has passed since the key was blocked elsewhere", async () => {
    const { id, key } = await createKey({ name: "leased-block-far" });
    const config = JSON.parse(env.WARMGATE_CONFIG) as Record<string, unknown>;
    const bindings = {
      ...env,
      WARMGATE_CONFIG: JSON.stringify({ ...config, leases: { window_ms: 500 } }),
    };
    await send(bindings, key);
    expect((await send(bindings, key)).response.status).toBe(200);
    // Another isolate's admin call: this one's lease is not told.
    await account(id).update({ blocked: true, now: Date.now() });
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect((await send(bindings, key)).response.status).toBe(403);
  });
});

describe("a lease its isolate stops renewing", () => {
  it("gives its slots and money back to the account when it lapses", async () => {
    const { id } = await createKey({
      name: "leased-lapse",
      limits: { concurrency: 8, credit_usd: 1 },
    });
    const stub = account(id);
    const secretHash = await runInDurableObject(
      stub,
      (_: KeyAccount, state) =>
        state.storage.sql.exec<{ h: string }>("SELECT secret_hash AS h FROM secrets").one().h,
    );
    const now = Date.now();
    const answer = await stub.lease({
      secretHash,
      held: null,
      mode: "renew",
      rate: { requests: 2, tokens: 200, picos: 1_000_000n, inFlight: 2 },
      windowMs: 1_000,
      models: [],
      now,
    });
    expect(answer.lease?.slots).toBeGreaterThan(0);
    expect((await spendOf(id)).reserved).toBeGreaterThan(0n);
    await new Promise((resolve) => setTimeout(resolve, 2_100));
    await runDurableObjectAlarm(stub);
    expect((await spendOf(id)).reserved).toBe(0n);
    const leases = await runInDurableObject(stub, (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ state: string; slots: number }>("SELECT state, slots FROM leases")
        .toArray();
    });
    expect(leases).toEqual([{ state: "ended", slots: 0 }]);
  });
});
