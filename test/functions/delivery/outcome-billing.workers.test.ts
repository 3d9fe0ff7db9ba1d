import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { type ItemRecord, OutcomesResponseSchema } from "../../../contracts/protocol/schema.ts";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { type DispatchOptions, dispatchCompletion } from "../../../functions/delivery/failover.ts";
import { directOpener } from "../../../functions/delivery/opener.ts";
import {
  generatedBy,
  servedOrGivenUp,
  unservedUsage,
} from "../../../functions/delivery/generated.ts";
import type { OpenItem } from "../../../functions/delivery/item.ts";
import { respond } from "../../../functions/delivery/response.ts";
import app from "../../../functions/index.ts";
import { OriginPool } from "../../../functions/delivery/origin-pool.ts";
import { type SettledRequest, Settlement } from "../../../functions/accounts/settlement.ts";
import { chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { CredentialRing } from "../../../contracts/credentials.ts";

// Straight to the origin, on this file's own credential ring.
const openDirect = directOpener(new CredentialRing());

// What an attempt generated is billed whatever ended it, even when its END never reached
// the edge: then its origin's outcome record says (docs/key-account.md).
const SLOW = inject("testOrigins").find((origin) => origin.id === "meter-slow-1")?.url ?? "";

/** meter-slow-1 (about 20 ms a token) alone, with a short request timeout. */
function slowConfig(batching: boolean | "always", limits: Record<string, number> = {}): string {
  return JSON.stringify({
    models: [
      {
        id: "warmgate-sim-8b",
        max_model_len: 32768,
        pricing: { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 },
      },
    ],
    regions: [{ id: "metering-slow", origins: [{ id: "meter-slow-1", url: SLOW }] }],
    default_region: "metering-slow",
    limits: { first_byte_timeout_ms: 3_000, request_timeout_ms: 600, retry_budget: 0, ...limits },
    batching: batching === "always" ? { idle_bypass_ms: 0 } : { enabled: batching },
  });
}

async function send(config: string, request: Request): Promise<Response> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  const body = await response.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return new Response(body, response);
}

type RequestRecord = {
  status: string;
  outcome: string;
  completion_tokens: number | null;
  cost_usd: number;
};

async function recordOf(config: string, key: string, id: string): Promise<RequestRecord> {
  const headers = { authorization: `Bearer ${key}` };
  const response = await send(config, edgeRequest(`/v1/usage/requests/${id}`, { headers }));
  return response.json();
}

/** What meter-slow-1 remembers of request `id`'s items. */
async function originRecords(id: string): Promise<ItemRecord[]> {
  const response = await fetch(`${SLOW}/v1/batch/outcomes`, {
    method: "POST",
    body: JSON.stringify({ ids: [id] }),
  });
  return OutcomesResponseSchema.parse(await response.json()).items;
}

describe("billing an answer whose END never reached the edge", () => {
  // A stream cut at its timeout is stopped at once; its END is not waited for.
  it.each([
    ["sent straight", false],
    ["through the Batcher", "always"],
  ] as const)(
    "bills a stream %s cut at its request timeout for what its origin generated",
    async (_, batching) => {
      const { key } = await createKey({ name: "timeout-bill" });
      const config = slowConfig(batching);
      const response = await send(
        config,
        edgeRequest("/v1/chat/completions", {
          body: chatBody({ stream: true, max_tokens: 4_000 }),
          headers: { authorization: `Bearer ${key}` },
        }),
      );
      expect(response.status).toBe(200);
      const id = response.headers.get("x-request-id") ?? "";
      const [item] = await originRecords(id);
      expect(item).toMatchObject({ id, state: "ended" });
      const generated = item?.state === "ended" ? (item.usage?.completion_tokens ?? 0) : 0;
      expect(generated).toBeGreaterThan(0);
      expect(generated).toBeLessThan(4_000);
      const record = await recordOf(config, key, id);
      expect(record).toMatchObject({
        status: "settled",
        outcome: "timeout",
        completion_tokens: generated,
      });
      expect(record.cost_usd).toBeGreaterThan(0);
    },
  );
});

describe("asking an origin what an attempt generated", () => {
  const ask = { tries: 2, intervalMs: 10, timeoutMs: 500 };

  it("knows nothing was generated when the origin answers and does not remember the item", async () => {
    const id = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    const origins = [{ id: "meter-slow-1", url: SLOW }];
    expect(await generatedBy(origins, id, [id], env, ask)).toEqual({
      known: true,
      usage: null,
      outcome: null,
      origin: null,
    });
  });

  it("does not know, and leaves the bill to the key's account, when the origin does not answer", async () => {
    // An origin that answered the item a moment ago may only be slow to answer the lookup:
    // its record can still bill what it generated (docs/key-account.md).
    const id = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    const origins = [{ id: "gone", url: "http://127.0.0.1:1" }];
    expect(await generatedBy(origins, id, [id], env, ask)).toEqual({ known: false });
  });

  it("knows nothing was generated when the origin could not be reached for the attempt either", async () => {
    // Down for the call and for the lookup: it took its record with it, and an outage
    // costs its client nothing (docs/key-account.md).
    const id = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    const gone = { id: "gone", url: "http://127.0.0.1:1" };
    const record = {
      requestId: id,
      model: "warmgate-sim-8b",
      usage: null,
      outcome: "error" as const,
      origin: null,
      region: null,
      status: 502,
      originBegan: false,
    };
    const unreachable = [{ region: "eu", origin: gone, itemId: id, unreachable: true as const }];
    expect(await unservedUsage(record, unreachable, env)).toEqual(record);
    // One that took the call (it timed out) may hold a record it is slow to tell.
    const hung = [{ region: "eu", origin: gone, itemId: id }];
    expect(await unservedUsage(record, hung, env)).toMatchObject({ usageUnknown: true });
  });

  it("leaves the bill to the key's account when an attempt given up on cannot be asked", async () => {
    const id = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    const silent = { id: "gone", url: "http://127.0.0.1:1" };
    const gaveUp = [{ region: "eu", origin: silent, itemId: id }];
    const served = { region: "eu", origin: "meter-slow-1" };
    const usage = { prompt_tokens: 20, completion_tokens: 3, total_tokens: 23, cached_tokens: 0 };
    // The silent origin may hold an attempt that outranks this cut one (it finished there).
    const cut = { ...served, usage, outcome: "error" as const };
    expect(await servedOrGivenUp(cut, id, gaveUp, env)).toEqual({ ...cut, usageUnknown: true });
    const refused = { ...served, usage: null, outcome: "error" as const };
    expect(await servedOrGivenUp(refused, id, gaveUp, env)).toEqual({
      ...refused,
      usageUnknown: true,
    });
    // One its call could not reach is down, with its records: the cut attempt is the bill.
    const unreachable = [{ ...gaveUp[0]!, unreachable: true as const }];
    expect(await servedOrGivenUp(cut, id, unreachable, env)).toEqual(cut);
  });
});

/** A direct dispatch of `body` from meter-slow-1, alone in its region (no Batcher). */
function slowDispatch(requestId: string, body: string) {
  const config = loadConfig(slowConfig(false));
  const region = config.regions[0];
  const origin = region?.origins[0];
  if (region === undefined || origin === undefined) throw new Error("no origin");
  const options = {
    requestId,
    path: "/v1/chat/completions",
    body,
    model: "warmgate-sim-8b",
    candidates: [{ region, origin }],
    pool: new OriginPool(),
    limits: config.limits,
    delivery: "stream",
    headers: {},
    secrets: env,
  } satisfies Partial<DispatchOptions>;
  return { region, origin, options };
}

/**
 * A stream from meter-slow-1 whose END never reaches the edge (as through a Batcher whose
 * reading lags far behind), left by its client after two reads; the edge waits `endWaitMs`
 * for the END before it asks the origin.
 */
async function leaveStream(endWaitMs: number) {
  const requestId = `req_left${crypto.randomUUID().replaceAll("-", "")}`;
  const body = JSON.stringify(chatBody({ stream: true, max_tokens: 4_000 }));
  const { region, origin, options: base } = slowDispatch(requestId, body);
  const attempt = await openDirect(
    { region, origin },
    {
      requestId,
      attemptId: requestId,
      path: "/v1/chat/completions",
      body,
      headers: {},
      firstByteTimeoutMs: 3_000,
      delivery: "stream",
      itemTimeoutMs: 60_000,
      avoidOrigins: [],
      secrets: env,
    },
  );
  if (attempt.kind !== "open") throw new Error(`not opened: ${attempt.kind}`);
  // As through a Batcher whose reading lags far behind: the body comes, the END does not.
  const real = attempt.item;
  const item: OpenItem = {
    head: real.head,
    stream: (onGone) => ({ ...real.stream(onGone), ended: new Promise(() => {}) }),
    whole: () => real.whole(),
    cancel: () => real.cancel(),
  };
  const client = new AbortController();
  const settled = Promise.withResolvers<Omit<SettledRequest, "requestId">>();
  const released = Promise.withResolvers<Omit<SettledRequest, "requestId">>();
  const options: DispatchOptions = {
    ...base,
    open: openDirect,
    onSettled: settled.resolve,
    signal: client.signal,
    endWaitMs,
    onReleased: released.resolve,
  };
  const served = { region: region.id, origin: origin.id };
  const response = await respond(item, served, options, null, Date.now() + 60_000, []);
  const reader = (response.body as ReadableStream<Uint8Array>).getReader();
  await reader.read();
  await reader.read();
  client.abort();
  await reader.cancel();
  return { requestId, released: released.promise, settled: settled.promise };
}

describe("billing a stream whose client left", () => {
  it("bills it from its origin's record when its END never comes", async () => {
    const { requestId, settled } = await leaveStream(0);
    const record = await settled;
    const [found] = await originRecords(requestId);
    const usage = found?.state === "ended" ? found.usage : null;
    expect(usage?.completion_tokens).toBeGreaterThan(0);
    expect(record).toMatchObject({ outcome: "cancelled", usage, origin: "meter-slow-1" });
  });

  it("frees its slot as soon as its client leaves, before what it generated is known", async () => {
    const order: string[] = [];
    const { released, settled } = await leaveStream(300);
    void settled.then(() => order.push("settled"));
    expect(await released).toMatchObject({ outcome: "cancelled", usage: null, usageUnknown: true });
    order.push("released");
    expect((await settled).usage?.completion_tokens).toBeGreaterThan(0);
    expect(order).toEqual(["released", "settled"]);
  });
});

describe("refusing after generation began", () => {
  it("cancels the attempt it gave up on at its origin before refusing, and bills what it generated", async () => {
    const requestId = `req_refused${crypto.randomUUID().replaceAll("-", "")}`;
    const body = JSON.stringify(chatBody({ stream: true, max_tokens: 4_000 }));
    const { origin, options } = slowDispatch(requestId, body);
    const settlement = new Settlement(requestId, () => {});
    settlement.onUnserved((record) => unservedUsage(record, settlement.gaveUp, env));
    let running: ItemRecord[] = [];
    const refusal = dispatchCompletion({
      ...options,
      gaveUp: settlement.gaveUp,
      onSettled: (record) => settlement.settle(record),
      // An edge that gives up on an answer its origin has begun (as at a first-byte timeout
      // while its HEAD waited behind others) and leaves it running there.
      open: async (candidate, request) => {
        const attempt = await openDirect(candidate, request);
        if (attempt.kind !== "open") return attempt;
        const reader = attempt.item.stream(() => {}).body.getReader();
        await reader.read();
        await reader.read();
        running = await originRecords(requestId);
        return { kind: "failed", failure: "timeout", detail: "gave up", originId: origin.id };
      },
    });
    await expect(refusal).rejects.toMatchObject({ status: 504 });
    expect(running).toEqual([{ id: requestId, state: "running" }]);
    // Cancelled there before the refusal.
    const [item] = await originRecords(requestId);
    expect(item).toMatchObject({ state: "ended", outcome: "cancelled" });
    const generated = item?.state === "ended" ? item.usage : null;
    expect(generated?.completion_tokens).toBeGreaterThan(0);
    // Settled as any refusal is, it is billed for what its attempt generated.
    const billed = Promise.withResolvers<SettledRequest>();
    settlement.onSettled(billed.resolve);
    settlement.settle({
      model: "warmgate-sim-8b",
      outcome: "timeout",
      usage: null,
      region: null,
      origin: null,
      status: 504,
      originBegan: false,
    });
    expect(await billed.promise).toMatchObject({
      outcome: "timeout",
      usage: generated,
      origin: "meter-slow-1",
      originBegan: true,
    });
  });
});
