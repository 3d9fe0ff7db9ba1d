import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { RECONCILE_FIRST_ASK_MS } from "../../../durable-objects/key-account/settle.ts";
import { leasedRequestId } from "../../../contracts/lease-ids.ts";
import { mintApiKey, newKeyId } from "../../../functions/accounts/keys.ts";
import { postBatch, readBatch } from "../../origin/batch-client.ts";

const EU_1 = inject("testOrigins").find((o) => o.id === "eu-1")?.url ?? "";
const PRICE = {
  inputMicrosPerMtok: 100_000,
  cachedInputMicrosPerMtok: 25_000,
  outputMicrosPerMtok: 400_000,
};

async function newAccount(concurrency = 2) {
  const id = newKeyId();
  const { secretHash } = await mintApiKey(env, id);
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
  await stub.create({
    id,
    name: "leases",
    secretHash,
    limits: { rpm: 1_000, tpm: 1_000_000, concurrency },
    allowedOrigins: [],
    models: null,
    tier: "standard",
    expiresAt: null,
    now: Date.now(),
  });
  const admit = (requestId: string, leaseMs: number) =>
    stub.admit({
      requestId,
      credential: { kind: "key", secretHash },
      model: "warmgate-sim-8b",
      promptTokens: 50,
      maxTokens: 100,
      price: PRICE,
      leaseMs,
    });
  return { stub, admit, secretHash };
}

/** What an isolate asks for one end user's lease of a key: 2 requests in flight, 2 s. */
function endUserAsk(secretHash: string, endUser: string) {
  return {
    secretHash,
    rate: { requests: 2, tokens: 300, picos: 0n, inFlight: 2 },
    windowMs: 2_000,
    models: [{ model: "warmgate-sim-8b", price: PRICE }],
    scope: { endUser, subject: null },
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function recordOf(stub: DurableObjectStub<KeyAccount>, requestId: string) {
  const found = await stub.record({ requestId });
  if (!found.ok || found.record === null) throw new Error(`no record of ${requestId}`);
  return found.record;
}

describe("KeyAccount leases", () => {
  it("keeps a renewed request open past its first lease", async () => {
    const { stub, admit } = await newAccount();
    expect((await admit("req_renewed", 1_000)).ok).toBe(true);
    expect(await stub.renew({ requestIds: ["req_renewed", "req_unknown"], leaseMs: 60_000 })).toBe(
      1,
    );
    await sleep(1_100);
    await runDurableObjectAlarm(stub);
    expect((await recordOf(stub, "req_renewed")).state).toBe("open");
  });

  it("gives a lapsed request's slot back, so a crash does not hold the key's concurrency", async () => {
    const { admit, stub } = await newAccount();
    expect((await admit("req_cut_1", 1_000)).ok).toBe(true);
    expect((await admit("req_cut_2", 1_000)).ok).toBe(true);
    expect(await admit("req_cut_3", 1_000)).toMatchObject({ code: "rate_limit_exceeded" });
    await sleep(1_100);
    await runDurableObjectAlarm(stub);
    expect((await admit("req_after", 20_000)).ok).toBe(true);
    // Neither reached an origin: they stay expired, at no cost.
    expect(await recordOf(stub, "req_cut_1")).toMatchObject({ state: "expired", costPicos: 0n });
  });

  it("bills a lapsed request from what its origin remembers, never as ok", async () => {
    const { admit, stub } = await newAccount();
    const requestId = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    expect((await admit(requestId, 1_000)).ok).toBe(true);
    // The edge sent it and died before it could settle: only the origin saw its END.
    const body = JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "Bill me after a crash." }],
      max_tokens: 7,
    });
    const answer = await readBatch(
      await postBatch(EU_1, "lapse", [{ id: requestId, path: "/v1/chat/completions", body }]),
    );
    const usage = answer.items.get(0)?.end?.usage;
    expect(usage?.completion_tokens).toBe(7);
    await sleep(1_100);
    await runDurableObjectAlarm(stub);
    const record = await recordOf(stub, requestId);
    expect(record).toMatchObject({
      state: "settled",
      outcome: "cancelled",
      promptTokens: usage?.prompt_tokens,
      completionTokens: 7,
    });
    expect(record.costPicos).toBeGreaterThan(0n);
    // Once: another alarm changes nothing.
    await runDurableObjectAlarm(stub);
    expect((await recordOf(stub, requestId)).costPicos).toBe(record.costPicos);
  });

  it("asks the origins later for a request whose edge could not learn its usage, freeing its slot now", async () => {
    const { admit, stub } = await newAccount();
    const requestId = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    expect((await admit(requestId, 60_000)).ok).toBe(true);
    expect((await admit("req_other", 60_000)).ok).toBe(true);
    // Its END never reached the edge, and its origin did not answer then.
    const handedOver = await stub.settle({
      requestId,
      outcome: "cancelled",
      usage: null,
      usageUnknown: true,
    });
    expect(handedOver).toMatchObject({ settled: false, reason: "reconciling" });
    expect((await admit("req_third", 60_000)).ok).toBe(true);
    const body = JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "Bill me once my origin answers." }],
      max_tokens: 5,
    });
    await readBatch(
      await postBatch(EU_1, "late", [{ id: requestId, path: "/v1/chat/completions", body }]),
    );
    await runDurableObjectAlarm(stub);
    const record = await recordOf(stub, requestId);
    expect(record).toMatchObject({ state: "settled", completionTokens: 5 });
    expect(record.costPicos).toBeGreaterThan(0n);
  });

  it("settles a request its edge could not learn the usage of as its edge saw it end, once no origin remembers it", async () => {
    const { admit, stub } = await newAccount();
    const requestId = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    expect((await admit(requestId, 60_000)).ok).toBe(true);
    // Its origin did not answer the edge's lookup in time; it ended in an error for its client.
    const handedOver = await stub.settle({
      requestId,
      outcome: "error",
      usage: null,
      usageUnknown: true,
    });
    expect(handedOver).toMatchObject({ settled: false, reason: "reconciling" });
    expect(await recordOf(stub, requestId)).toMatchObject({ state: "expired", outcome: "error" });
    // Its origins are first asked a second later, not at its lease's end nor the retry's.
    const alarmAt = await runInDurableObject(stub, (_i: KeyAccount, state) =>
      state.storage.getAlarm(),
    );
    expect(alarmAt).toBeLessThanOrEqual(Date.now() + RECONCILE_FIRST_ASK_MS);
    // Every origin answers, none remembers it: nothing was generated, and it is not left expired.
    await runDurableObjectAlarm(stub);
    const record = await recordOf(stub, requestId);
    expect(record).toMatchObject({ state: "settled", outcome: "error", costPicos: 0n });
    expect(record.completionTokens ?? 0).toBe(0);
  });

  it("keeps the outcome an edge tells after its request's lease lapsed, and settles it so", async () => {
    const { admit, stub } = await newAccount();
    const requestId = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    expect((await admit(requestId, 1_000)).ok).toBe(true);
    await sleep(1_100);
    await runDurableObjectAlarm(stub);
    expect(await recordOf(stub, requestId)).toMatchObject({ state: "expired", outcome: "expired" });
    // Its edge was slow, not dead: it tells how the request ended, without its usage.
    await stub.settle({ requestId, outcome: "timeout", usage: null, usageUnknown: true });
    expect(await recordOf(stub, requestId)).toMatchObject({ state: "expired", outcome: "timeout" });
    await runDurableObjectAlarm(stub);
    expect(await recordOf(stub, requestId)).toMatchObject({
      state: "settled",
      outcome: "timeout",
      costPicos: 0n,
    });
  });

  it("frees a released request's slot at once, and bills it once from the settlement that follows", async () => {
    const { admit, stub } = await newAccount();
    expect((await admit("req_left", 60_000)).ok).toBe(true);
    expect((await admit("req_other", 60_000)).ok).toBe(true);
    // Its client went away; what its origin generated is not known yet.
    const released = await stub.settle({
      requestId: "req_left",
      outcome: "cancelled",
      usage: null,
      usageUnknown: true,
    });
    expect(released).toMatchObject({ settled: false, reason: "reconciling" });
    expect((await admit("req_next", 60_000)).ok).toBe(true);
    // Its END came: billed once.
    const usage = { prompt_tokens: 50, completion_tokens: 30 };
    const settled = await stub.settle({ requestId: "req_left", outcome: "cancelled", usage });
    expect(settled).toMatchObject({ settled: true, usedTokens: 80 });
    expect(await stub.settle({ requestId: "req_left", outcome: "cancelled", usage })).toMatchObject(
      { settled: false, reason: "already_settled" },
    );
    const record = await recordOf(stub, "req_left");
    expect(record).toMatchObject({ state: "settled", completionTokens: 30 });
    expect(record.costPicos).toBeGreaterThan(0n);
  });

  it("holds a lapsed lease's unsettled ids as one range, and bills the one an origin ran, once", async () => {
    const id = newKeyId();
    const { secretHash } = await mintApiKey(env, id);
    const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    await stub.create({
      id,
      name: "lapsed-range",
      secretHash,
      limits: { rpm: 1_000_000, tpm: 100_000_000, concurrency: 8 },
      allowedOrigins: [],
      models: null,
      tier: "standard",
      expiresAt: null,
      now: Date.now(),
    });
    const granted = await stub.lease({
      secretHash,
      held: null,
      mode: "renew",
      rate: { requests: 100_000, tokens: 10_000_000, picos: 0n, inFlight: 2 },
      windowMs: 1_000,
      models: [
        { model: "warmgate-sim-8b", price: PRICE },
        { model: "warmgate-sim-70b", price: PRICE },
      ],
    });
    const lease = granted.lease;
    if (lease === null) throw new Error("no lease granted");
    // Hundreds of thousands of ids, two models each: every one could name a request.
    expect(lease.granted.ids).toBeGreaterThanOrEqual(100_000);
    const requestId = leasedRequestId(lease.leaseId, 0, lease.granted.ids - 1);
    // Its isolate died after the origin ran the request, before its settlement left.
    const body = JSON.stringify({
      model: "warmgate-sim-8b",
      messages: [{ role: "user", content: "Bill me after my lease lapsed." }],
      max_tokens: 6,
    });
    const answer = await readBatch(
      await postBatch(EU_1, "lapsed-lease", [
        { id: requestId, path: "/v1/chat/completions", body },
      ]),
    );
    expect(answer.items.get(0)?.end?.usage?.completion_tokens).toBe(6);
    // The alarm waits, so that the lease is seen ended before the origins are asked.
    await runInDurableObject(stub, (_: KeyAccount, state) =>
      state.storage.setAlarm(Date.now() + 3_600_000),
    );
    await sleep(2_100);
    // Any call ends the lease; its ids are held as one entry, not one per id and model.
    await stub.admit({
      requestId: "req_after_lapse",
      credential: { kind: "key", secretHash },
      model: "warmgate-sim-8b",
      promptTokens: 5,
      maxTokens: 5,
      price: PRICE,
      leaseMs: 60_000,
    });
    expect(await stub.reconciling()).toEqual({ requests: 0, leases: 1 });
    await runDurableObjectAlarm(stub);
    const record = await recordOf(stub, requestId);
    expect(record).toMatchObject({ state: "settled", outcome: "cancelled", completionTokens: 6 });
    expect(record.costPicos).toBeGreaterThan(0n);
    // Nothing of it runs any more: the range is dropped, and a later look bills nothing twice.
    expect(await stub.reconciling()).toEqual({ requests: 0, leases: 0 });
    await runDurableObjectAlarm(stub);
    expect((await recordOf(stub, requestId)).costPicos).toBe(record.costPicos);
  });

  it("takes nothing again when it trims an end user's lease, so the key admits up to its concurrency", async () => {
    const { admit, stub, secretHash } = await newAccount(8);
    // An end user that sent one request: its lease holds slots it does not use.
    const ask = endUserAsk(secretHash, "user-once");
    const lease = (await stub.lease({ ...ask, held: null, mode: "renew" })).lease;
    expect(lease?.slots).toBe(4);
    for (let i = 0; i < 4; i++) expect((await admit(`req_busy_${i}`, 60_000)).ok).toBe(true);
    expect(await admit("req_refused", 60_000)).toMatchObject({ limit: "concurrency" });
    // Another request of the key was refused: the isolate trims the user's lease.
    const used = { requests: 0, tokens: 0, picos: 0n, ids: 0, inFlight: 0 };
    const held = { leaseId: lease?.leaseId ?? "", used };
    const trimmed = (await stub.lease({ ...ask, held, mode: "trim" })).lease;
    expect(trimmed).toMatchObject({ leaseId: held.leaseId, slots: 0 });
    for (let i = 0; i < 4; i++) expect((await admit(`req_again_${i}`, 60_000)).ok).toBe(true);
  });

  it("grants no new lease when it trims one that already ended", async () => {
    const { stub, secretHash } = await newAccount(8);
    const ask = endUserAsk(secretHash, "user-gone");
    const now = Date.now();
    const lease = (await stub.lease({ ...ask, held: null, mode: "renew", now })).lease;
    expect(lease?.slots).toBeGreaterThan(0);
    const used = { requests: 0, tokens: 0, picos: 0n, ids: 0, inFlight: 0 };
    const held = { leaseId: lease?.leaseId ?? "", used };
    // Asked long after it lapsed: the account ended it, and no slot goes to a user gone.
    const later = now + 60_000;
    expect((await stub.lease({ ...ask, held, mode: "trim", now: later })).lease).toBeNull();
  });
});
