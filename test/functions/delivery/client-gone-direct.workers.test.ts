import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import type { ItemRecord, OutcomesResponse } from "../../../contracts/protocol/schema.ts";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { CredentialRing } from "../../../contracts/credentials.ts";
import { dispatchCompletion } from "../../../functions/delivery/failover.ts";
import { type DispatchAttempt, directOpener } from "../../../functions/delivery/opener.ts";
import { unservedUsage } from "../../../functions/delivery/generated.ts";
import type { GivenUp } from "../../../functions/accounts/settlement.ts";
import { OriginPool } from "../../../functions/delivery/origin-pool.ts";
import { chatBody } from "../../support/edge-requests.ts";

// A client that goes away before its answer opened (a JSON answer is read whole first; a
// stream waits for its HEAD) on the path straight to an origin: its item is cancelled on
// the origin, no other origin is tried, the origin is not blamed, and what it generated
// is billed (docs/edge.md, "Delivery").
const openDirect = directOpener(new CredentialRing());
const originUrl = (id: string) =>
  inject("testOrigins").find((origin) => origin.id === id)?.url ?? "";
const SLOW = originUrl("meter-slow-1");
const GARBLED = originUrl("garbled-1");
const muted = async () =>
  (await fetch(`${GARBLED}/muted`)).json<{ taken: number; stopped: number }>();

/** A region of `first` and an origin that is never reached, batching off. */
function configWith(first: { id: string; url: string }) {
  return loadConfig(
    JSON.stringify({
      models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
      regions: [{ id: "gone", origins: [first, { id: "never-tried", url: "http://127.0.0.1:9" }] }],
      default_region: "gone",
      limits: { first_byte_timeout_ms: 30_000, request_timeout_ms: 120_000, retry_budget: 1 },
      batching: { enabled: false },
    }),
  );
}
const config = configWith({ id: "meter-slow-1", url: SLOW });

async function originRecord(id: string): Promise<ItemRecord | undefined> {
  const response = await fetch(`${SLOW}/v1/batch/outcomes`, {
    method: "POST",
    body: JSON.stringify({ ids: [id] }),
  });
  return (await response.json<OutcomesResponse>()).items[0];
}

/**
 * Dispatches `body` over the first origin of `at` (the second is never reached) straight
 * to it, its client's signal `client`: the origins tried, the verdicts on them, the attempts
 * given up on.
 */
function dispatchFor(
  at: ReturnType<typeof configWith>,
  requestId: string,
  body: Record<string, unknown>,
  client: AbortSignal,
) {
  const region = at.regions[0];
  if (region === undefined) throw new Error("no region");
  const tried: string[] = [];
  const verdicts: string[] = [];
  const gaveUp: GivenUp[] = [];
  const dispatched = dispatchCompletion({
    requestId,
    path: "/v1/chat/completions",
    body: JSON.stringify(body),
    model: "warmgate-sim-8b",
    candidates: region.origins.map((origin) => ({ region, origin })),
    pool: new OriginPool(),
    limits: at.limits,
    delivery: body["stream"] === true ? "stream" : "whole",
    headers: {},
    secrets: env,
    gaveUp,
    signal: client,
    onSettled: () => {},
    onOutcome: (_region, origin, verdict) => verdicts.push(`${origin}:${verdict}`),
    open: (candidate, request): Promise<DispatchAttempt> => {
      tried.push(candidate.origin.id);
      return openDirect(candidate, request);
    },
  });
  return { dispatched, tried, verdicts, gaveUp };
}

/** Dispatches a long JSON answer, its client leaving 300 ms after the origin started it. */
async function leaveEarly() {
  const requestId = `req_gone${crypto.randomUUID().replaceAll("-", "")}`;
  const client = new AbortController();
  const { dispatched, tried, verdicts, gaveUp } = dispatchFor(
    config,
    requestId,
    chatBody({ max_tokens: 20_000, ignore_eos: true }),
    client.signal,
  );
  // Gone once the origin runs the item.
  for (let i = 0; i < 500 && (await originRecord(requestId))?.state !== "running"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  await new Promise((resolve) => setTimeout(resolve, 300));
  client.abort();
  // Ended for no one: the client is gone, whatever the answer.
  await dispatched.catch(() => null);
  return { requestId, tried, verdicts, gaveUp };
}

describe("a client that leaves before its answer opened, sent straight to an origin", () => {
  it("cancels a JSON answer on its origin and bills what it generated", async () => {
    const { requestId, tried, verdicts, gaveUp } = await leaveEarly();
    expect(tried).toEqual(["meter-slow-1"]);
    expect(verdicts).toEqual([]);
    let record = await originRecord(requestId);
    for (let i = 0; i < 200 && record?.state !== "ended"; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      record = await originRecord(requestId);
    }
    expect(record).toMatchObject({ id: requestId, state: "ended", outcome: "cancelled" });
    const generated = record?.state === "ended" ? (record.usage?.completion_tokens ?? 0) : 0;
    expect(generated).toBeGreaterThan(0);
    expect(generated).toBeLessThan(20_000);
    const unserved = {
      requestId,
      model: "warmgate-sim-8b",
      outcome: "cancelled" as const,
      usage: null,
      region: null,
      origin: null,
      status: 499,
      originBegan: false,
    };
    const billed = await unservedUsage(unserved, gaveUp, env);
    expect(billed.usage?.completion_tokens).toBe(generated);
  });

  it("closes the call of a stream still waiting for its HEAD, trying no other origin", async () => {
    // garbled-1 takes a `mute` item's call and sends nothing until the item is stopped.
    const before = await muted();
    const client = new AbortController();
    const { dispatched, tried, verdicts } = dispatchFor(
      configWith({ id: "garbled-1", url: GARBLED }),
      `req_mute${crypto.randomUUID().replaceAll("-", "")}`,
      chatBody({ stream: true, user: "mute" }),
      client.signal,
    );
    for (let i = 0; i < 500 && (await muted()).taken === before.taken; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    client.abort();
    // Never opened: it ends with an error no client reads.
    await expect(dispatched).rejects.toMatchObject({ status: 503 });
    expect(tried).toEqual(["garbled-1"]);
    expect(verdicts).toEqual([]);
    let after = await muted();
    for (let i = 0; i < 200 && after.stopped === before.stopped; i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      after = await muted();
    }
    expect(after.stopped).toBe(before.stopped + 1);
  });
});
