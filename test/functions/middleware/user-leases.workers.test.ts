import {
  createExecutionContext,
  runInDurableObject,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { leasedRequestId, parseLeasedId } from "../../../contracts/lease-ids.ts";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import app from "../../../functions/index.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { chatBody, edgeRequest } from "../../support/edge-requests.ts";

function account(id: string): DurableObjectStub<KeyAccount> {
  return env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
}

/**
 * The bindings with every call to a key's account counted by method, in `calls`, and the
 * request ids admitted exactly in `exact`.
 */
function countingEnv(
  calls: string[],
  config: Record<string, unknown> = {},
  exact: string[] = [],
): Env {
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
              if (method === "admit") exact.push((args[0] as { requestId: string }).requestId);
              return Reflect.apply(value, stub, args);
            };
          },
        });
    },
  });
  const base = JSON.parse(env.WARMGATE_CONFIG) as Record<string, unknown>;
  // The shortest window: leases renew within the test.
  const leases = { window_ms: 500, ...(config["leases"] as object | undefined) };
  const WARMGATE_CONFIG = JSON.stringify({ ...base, ...config, leases });
  return { ...env, KEY_ACCOUNT: counted, WARMGATE_CONFIG };
}

async function send(bindings: Env, bearer: string, overrides: Record<string, unknown> = {}) {
  const ctx = createExecutionContext();
  const request = edgeRequest("/v1/chat/completions", {
    body: chatBody(overrides),
    headers: { authorization: `Bearer ${bearer}` },
    region: "eu",
  });
  const response = await app.fetch(request, bindings, ctx);
  const text = await response.text();
  await waitOnExecutionContext(ctx);
  return { response, text };
}

/** A browser token of `key` for the end user `user`, with its own limits. */
async function token(
  key: string,
  user: string,
  limits: { rpm: number; tpm: number; concurrency: number },
  budgets: { period: string; max_usd: number }[] = [],
): Promise<string> {
  const res = await exports.default.fetch("http://edge.test/v1/tokens", {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ user, limits, budgets }),
  });
  expect(res.status).toBe(200);
  return (await res.json<{ token: string }>()).token;
}

const ROOMY = { rpm: 1_000, tpm: 1_000_000, concurrency: 16 };

describe("an end user with headroom", () => {
  it("is admitted under its own lease, with no call to the key's account before the origin", async () => {
    const { key } = await createKey({ name: "user-leased" });
    const calls: string[] = [];
    const bindings = countingEnv(calls);
    // The first request is admitted exactly; its answer grants the user a lease.
    expect((await send(bindings, key, { user: "alice" })).response.status).toBe(200);
    expect(calls.filter((call) => call === "admit")).toHaveLength(1);
    for (let i = 0; i < 3; i++) {
      const before = calls.length;
      const { response } = await send(bindings, key, { user: "alice" });
      expect(response.status).toBe(200);
      expect(parseLeasedId(response.headers.get("x-request-id") ?? "")).not.toBeNull();
      expect(calls.slice(before)).not.toContain("admit");
    }
  });

  it("of a browser token is admitted under its own lease too, and its rows name it", async () => {
    const { id, key } = await createKey({ name: "token-leased" });
    const bearer = await token(key, "bob", ROOMY);
    const calls: string[] = [];
    const bindings = countingEnv(calls);
    expect((await send(bindings, bearer)).response.status).toBe(200);
    const before = calls.length;
    const { response } = await send(bindings, bearer);
    expect(response.status).toBe(200);
    const requestId = response.headers.get("x-request-id") ?? "";
    expect(parseLeasedId(requestId)).not.toBeNull();
    expect(calls.slice(before)).not.toContain("admit");
    const row = await runInDurableObject(account(id), (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ end_user: string | null; subject: string | null }>(
          "SELECT end_user, subject FROM ledger WHERE request_id = ?",
          requestId,
        )
        .one();
    });
    expect(row).toEqual({ end_user: "bob", subject: "user:bob" });
  });
});

describe("an end user with budgets", () => {
  it("is admitted exactly every time, so its budget holds", async () => {
    const { key } = await createKey({ name: "user-budgeted" });
    const bearer = await token(key, "carol", ROOMY, [{ period: "1d", max_usd: 0.0002 }]);
    const calls: string[] = [];
    const { models } = JSON.parse(env.WARMGATE_CONFIG) as { models: object[] };
    const pricing = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };
    const bindings = countingEnv(calls, { models: models.map((m) => ({ ...m, pricing })) });
    const statuses: number[] = [];
    let last = "";
    while (statuses.at(-1) !== 429 && statuses.length < 60) {
      const before = calls.length;
      const { response, text } = await send(bindings, bearer, { max_tokens: 40 });
      statuses.push(response.status);
      last = text;
      expect(calls.slice(before)).toContain("admit");
    }
    expect(statuses.filter((status) => status === 200).length).toBeGreaterThan(2);
    expect(statuses.at(-1)).toBe(429);
    expect(JSON.parse(last)).toMatchObject({
      error: { code: "insufficient_quota", message: expect.stringMatching(/this end user of key/) },
    });
    const usage = await exports.default.fetch("http://edge.test/v1/usage?user=carol", {
      headers: { authorization: `Bearer ${key}` },
    });
    const { total } = await usage.json<{ total: { cost_usd: number } }>();
    expect(total.cost_usd).toBeGreaterThan(0);
    expect(total.cost_usd).toBeLessThanOrEqual(0.0002);
  });

  it("finds what the key's leases here hold unused, trimmed when it is refused", async () => {
    const { key } = await createKey({ name: "user-budgeted-trim", limits: { rpm: 40 } });
    // A window the test never outlasts: the isolate holds the key's lease throughout.
    const bindings = countingEnv([], { leases: { window_ms: 30_000 } });
    // The key's own lease takes part of its 40 requests a minute.
    for (let i = 0; i < 3; i++) expect((await send(bindings, key)).response.status).toBe(200);
    const bearer = await token(key, "dave", ROOMY, [{ period: "1d", max_usd: 1 }]);
    let admitted = 0;
    while ((await send(bindings, bearer)).response.status === 200 && admitted < 60) admitted++;
    // Without the trim the key's lease kept a quarter of the minute's requests (30 admitted).
    expect(admitted).toBeGreaterThanOrEqual(35);
    expect(admitted).toBeLessThanOrEqual(38);
  });
});

describe("an end user's limit under leases", () => {
  it("is never exceeded by 40 concurrent requests of that user", async () => {
    const { id, key } = await createKey({ name: "user-limit" });
    const limits = { rpm: 20, tpm: 1_000_000, concurrency: 40 };
    const bearer = await token(key, "carol", limits);
    const exact: string[] = [];
    const bindings = countingEnv([], {}, exact);
    const started = Date.now();
    // The first is admitted exactly and leaves the user a lease.
    expect((await send(bindings, bearer)).response.status).toBe(200);
    const answers = await Promise.all(Array.from({ length: 40 }, () => send(bindings, bearer)));
    const statuses = answers.map(({ response }) => response.status);
    expect(statuses.every((status) => status === 200 || status === 429)).toBe(true);
    // Some were admitted under the user's lease, with no admit call of their own.
    const ids = answers
      .filter(({ response }) => response.status === 200)
      .map(({ response }) => response.headers.get("x-request-id") ?? "");
    expect(ids.filter((requestId) => !exact.includes(requestId)).length).toBeGreaterThan(0);
    // What the bucket refilled while the test ran is all that may pass beyond the limit.
    const refilled = Math.floor((limits.rpm * (Date.now() - started)) / 60_000);
    const admitted = 1 + statuses.filter((status) => status === 200).length;
    expect(admitted).toBeLessThanOrEqual(limits.rpm + refilled);
    expect(statuses).toContain(429);
    // Its account agrees: every admitted request has its row, each naming the user.
    const rows = await runInDurableObject(account(id), (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ n: number }>("SELECT COUNT(*) AS n FROM ledger WHERE end_user = 'carol'")
        .one().n;
    });
    expect(rows).toBe(admitted);
  });

  it("refuses a user over its limit with the same 429 and headers as exact admission", async () => {
    const limits = { rpm: 20, tpm: 1_000_000, concurrency: 8 };
    const refusal = async (leases: boolean) => {
      const { id, key } = await createKey({ name: `user-over-${leases}` });
      const bearer = await token(key, "dave", limits);
      const exact: string[] = [];
      const bindings = countingEnv([], { leases: { enabled: leases } }, exact);
      const ids: string[] = [];
      // Until the limit refuses one: the bucket refills while the test runs.
      let last = await send(bindings, bearer);
      for (let i = 0; i < 2 * limits.rpm && last.response.status === 200; i++) {
        ids.push(last.response.headers.get("x-request-id") ?? "");
        last = await send(bindings, bearer);
      }
      expect(ids.length).toBeGreaterThanOrEqual(limits.rpm);
      const { response, text } = last;
      const body = JSON.parse(text) as { error: { message: string } };
      // The key id and the time to wait differ between the two runs; nothing else may.
      body.error.message = body.error.message
        .replace(id, "<key>")
        .replace(/try again in .+$/, "try again in <t>");
      const headers = Object.fromEntries(
        [...response.headers].filter(
          ([name]) => name.startsWith("x-ratelimit-") || name.startsWith("retry-after"),
        ),
      );
      return {
        status: response.status,
        body,
        headers,
        leased: ids.filter((requestId) => !exact.includes(requestId)).length,
      };
    };
    const exact = await refusal(false);
    const leased = await refusal(true);
    expect(exact.leased).toBe(0);
    expect(leased.leased).toBeGreaterThan(0);
    expect(leased.status).toBe(429);
    expect(leased.body).toEqual(exact.body);
    expect(Object.keys(leased.headers).sort()).toEqual(Object.keys(exact.headers).sort());
    for (const name of [
      "x-ratelimit-limit-requests",
      "x-ratelimit-remaining-requests",
      "x-ratelimit-limit-tokens",
    ]) {
      expect({ [name]: leased.headers[name] }).toEqual({ [name]: exact.headers[name] });
    }
  });
});

describe("an end user's lease in its account", () => {
  it("names its user on the row of a request its isolate never reported", async () => {
    const { id } = await createKey({ name: "user-lease-lost" });
    const stub = account(id);
    const secretHash = await runInDurableObject(
      stub,
      (_: KeyAccount, state) =>
        state.storage.sql.exec<{ h: string }>("SELECT secret_hash AS h FROM secrets").one().h,
    );
    const answer = await stub.lease({
      secretHash,
      held: null,
      mode: "renew",
      rate: { requests: 2, tokens: 200, picos: 0n, inFlight: 1 },
      windowMs: 1_000,
      models: [
        {
          model: "warmgate-sim-8b",
          price: { inputMicrosPerMtok: 0, cachedInputMicrosPerMtok: 0, outputMicrosPerMtok: 0 },
        },
      ],
      scope: { endUser: "erin", subject: null },
    });
    const leaseId = answer.lease?.leaseId ?? "";
    expect(leaseId).not.toBe("");
    // As an origin's outcome record settles it once the lease lapsed: no word of the edge.
    const requestId = leasedRequestId(leaseId, 0, 0);
    await stub.settleMany([
      {
        requestId,
        outcome: "cancelled",
        usage: { prompt_tokens: 5, completion_tokens: 3, cached_tokens: 0 },
        originBegan: true,
      },
    ]);
    const row = await runInDurableObject(stub, (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ end_user: string | null }>(
          "SELECT end_user FROM ledger WHERE request_id = ?",
          requestId,
        )
        .one();
    });
    expect(row.end_user).toBe("erin");
  });
});

describe("a browser token's end user's lease in its account", () => {
  it("is granted to an admission of a token without budgets, never to one with", async () => {
    const limits = { rpm: 40, tpm: 100_000, concurrency: 4 };
    const admit = async (requestId: string, budgets: { period: string; limitMicros: number }[]) =>
      account((await createKey({ name: `token-lease-${budgets.length}` })).id).admit({
        requestId,
        endUser: "yan",
        credential: {
          kind: "browser",
          secretGeneration: 1,
          subject: "user:yan",
          limits,
          models: null,
          budgets: budgets.map((b) => ({ ...b, softMicros: null })),
        },
        model: "warmgate-sim-8b",
        promptTokens: 10,
        maxTokens: 10,
        lease: {
          rate: { requests: 4, tokens: 400, picos: 0n, inFlight: 2 },
          windowMs: 1_000,
          models: [],
          scope: { endUser: "yan", subject: { id: "user:yan", limits, models: null } },
          held: null,
          mode: "trim",
        },
      });
    const plain = await admit("req_yan_1", []);
    expect(plain.lease).toBeDefined();
    const budgeted = await admit("req_yan_2", [{ period: "1d", limitMicros: 1_000_000 }]);
    expect(budgeted.ok).toBe(true);
    expect(budgeted.lease ?? null).toBeNull();
  });

  it("takes from the user's own buckets and slots, and gives back what it did not use", async () => {
    const { id } = await createKey({ name: "token-lease-buckets" });
    const stub = account(id);
    const subject = { id: "user:zed", limits: { rpm: 40, tpm: 100_000, concurrency: 4 } };
    const scope = { endUser: "zed", subject: { ...subject, models: null } };
    const ask = {
      secretHash: "gen:1",
      rate: { requests: 4, tokens: 400, picos: 0n, inFlight: 2 },
      windowMs: 1_000,
      models: [],
      scope,
    };
    const level = () =>
      runInDurableObject(stub, (instance: KeyAccount, state) => {
        instance.flush();
        return state.storage.sql
          .exec<{ level: number }>(
            "SELECT level FROM buckets WHERE scope = 'u:user:zed' AND kind = 'requests'",
          )
          .one().level;
      });
    const granted = await stub.lease({ ...ask, held: null, mode: "renew" });
    const lease = granted.lease;
    expect(lease?.granted.requests).toBe(8);
    // Its slots count against the user's concurrency: half its free slots at most.
    expect(lease?.slots).toBe(2);
    expect(Math.round(await level())).toBe(32);
    const admit = (requestId: string) =>
      stub.admit({
        requestId,
        credential: {
          kind: "browser",
          secretGeneration: 1,
          subject: subject.id,
          limits: subject.limits,
          models: null,
        },
        model: "warmgate-sim-8b",
        promptTokens: 10,
        maxTokens: 10,
      });
    expect((await admit("req_zed_1")).ok).toBe(true);
    expect((await admit("req_zed_2")).ok).toBe(true);
    expect(await admit("req_zed_3")).toMatchObject({ limit: "concurrency", scope: "end_user" });
    // Released unused: its requests and slots are the user's again.
    const used = { requests: 0, tokens: 0, picos: 0n, ids: 0, inFlight: 0 };
    await stub.lease({ ...ask, held: { leaseId: lease?.leaseId ?? "", used }, mode: "release" });
    expect(Math.round(await level())).toBe(38);
    expect((await admit("req_zed_3")).ok).toBe(true);
  });
});
