import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import {
  type ItemRecord,
  type ItemTrailer,
  type OutcomesResponse,
} from "../../../contracts/protocol/schema.ts";
import { type Frame, FrameType, encodeJsonPayload } from "../../../contracts/protocol/framing.ts";
import { loadConfig } from "../../../contracts/config/gateway.ts";
import { dispatchCompletion } from "../../../functions/delivery/failover.ts";
import {
  type AttemptRequest,
  type DispatchAttempt,
  directOpener,
} from "../../../functions/delivery/opener.ts";
import { unservedUsage } from "../../../functions/delivery/generated.ts";
import type { GivenUp } from "../../../functions/accounts/settlement.ts";
import { type OpenItem, frameItem, memoryFrames } from "../../../functions/delivery/item.ts";
import { OriginPool } from "../../../functions/delivery/origin-pool.ts";
import type { SettledRequest } from "../../../functions/accounts/settlement.ts";
import { chatBody } from "../../support/edge-requests.ts";
import { CredentialRing } from "../../../contracts/credentials.ts";

// Straight to the origin, on this file's own credential ring.
const openDirect = directOpener(new CredentialRing());

// A request is billed for one of its attempts, by the rule of contracts/outcomes.ts: the one
// that finished, else the one that generated the most, also when another origin answered
// it last (docs/key-account.md, "Billing every outcome").
const SLOW = inject("testOrigins").find((origin) => origin.id === "meter-slow-1")?.url ?? "";

const config = loadConfig(
  JSON.stringify({
    models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
    regions: [
      {
        id: "metering-slow",
        origins: [
          { id: "meter-slow-1", url: SLOW },
          // Never reached: the test answers for it.
          { id: "stand-in", url: "http://127.0.0.1:9" },
        ],
      },
    ],
    default_region: "metering-slow",
    limits: { first_byte_timeout_ms: 3_000, request_timeout_ms: 30_000, retry_budget: 1 },
    batching: { enabled: false },
  }),
);

async function originRecords(id: string): Promise<ItemRecord[]> {
  const response = await fetch(`${SLOW}/v1/batch/outcomes`, {
    method: "POST",
    body: JSON.stringify({ ids: [id] }),
  });
  return (await response.json<OutcomesResponse>()).items;
}

/** An answer read from memory: a HEAD, one body chunk and an END. */
function answer(
  id: string,
  status: number,
  type: string,
  body: string,
  end: ItemTrailer,
): OpenItem {
  const frames: Frame[] = [
    { type: FrameType.DATA, item: 0, payload: new TextEncoder().encode(body) },
    { type: FrameType.END, item: 0, payload: encodeJsonPayload(end), trailer: end },
  ];
  const head = { id, status, headers: { "content-type": type } };
  return frameItem(head, memoryFrames(frames), { cancel: () => {} });
}

/**
 * A streamed request whose first attempt, at meter-slow-1, is given up on after `chunks`
 * chunks (as at a breaker that opened), and whose second is answered by `second`.
 */
async function giveUpThenAnswer(
  chunks: number,
  second: (request: AttemptRequest) => OpenItem,
): Promise<{ requestId: string; status: number; settled: SettledRequest }> {
  const region = config.regions[0];
  if (region === undefined) throw new Error("no region");
  const requestId = `req_given${crypto.randomUUID().replaceAll("-", "")}`;
  const settled = Promise.withResolvers<Omit<SettledRequest, "requestId">>();
  let status = 0;
  try {
    const response = await dispatchCompletion({
      requestId,
      path: "/v1/chat/completions",
      body: JSON.stringify(chatBody({ stream: true, max_tokens: 4_000 })),
      model: "warmgate-sim-8b",
      candidates: region.origins.map((origin) => ({ region, origin })),
      pool: new OriginPool(),
      limits: config.limits,
      delivery: "stream",
      headers: {},
      secrets: env,
      onSettled: settled.resolve,
      open: async (candidate, request): Promise<DispatchAttempt> => {
        if (candidate.origin.id !== "meter-slow-1") {
          return { kind: "open", item: second(request), originId: candidate.origin.id };
        }
        const attempt = await openDirect(candidate, request);
        if (attempt.kind !== "open") return attempt;
        const reader = attempt.item.stream(() => {}).body.getReader();
        for (let i = 0; i < chunks; i++) await reader.read();
        await reader.cancel();
        return { kind: "failed", failure: "timeout", detail: "gave up", originId: "meter-slow-1" };
      },
    });
    status = response.status;
    await response.arrayBuffer();
  } catch (error) {
    status = (error as { status: number }).status;
  }
  return { requestId, status, settled: { requestId, ...(await settled.promise) } };
}

/** What meter-slow-1 generated for `requestId`'s first attempt, once it ended there. */
async function generatedFirst(requestId: string): Promise<number> {
  const [item] = await originRecords(requestId);
  expect(item).toMatchObject({ id: requestId, state: "ended" });
  return item?.state === "ended" ? (item.usage?.completion_tokens ?? 0) : 0;
}

describe("billing a request for an attempt it gave up on", () => {
  it("bills an origin's 429 answer for the tokens the attempt before it generated", async () => {
    const { requestId, status, settled } = await giveUpThenAnswer(6, (request) =>
      answer(request.attemptId, 429, "application/json", '{"error":{"message":"busy"}}', {
        id: request.attemptId,
        outcome: "error",
        usage: null,
      }),
    );
    expect(status).toBe(429);
    const generated = await generatedFirst(requestId);
    expect(generated).toBeGreaterThan(0);
    expect(settled).toMatchObject({ origin: "meter-slow-1", status: 429 });
    expect(settled.usage?.completion_tokens).toBe(generated);
  });

  it("bills a stream cut by its last origin for the attempt that generated more", async () => {
    const { requestId, status, settled } = await giveUpThenAnswer(12, (request) =>
      answer(request.attemptId, 200, "text/event-stream", "data: {}\n\n", {
        id: request.attemptId,
        outcome: "error",
        usage: { prompt_tokens: 9, completion_tokens: 1, total_tokens: 10, cached_tokens: 0 },
        error: { message: "cut", type: "server_error", code: "origin_error" },
      }),
    );
    expect(status).toBe(200);
    const generated = await generatedFirst(requestId);
    expect(generated).toBeGreaterThan(1);
    expect(settled).toMatchObject({ outcome: "error", origin: "meter-slow-1" });
    expect(settled.usage?.completion_tokens).toBe(generated);
  });

  it("keeps the bill of a last attempt that finished, whatever the one before generated", async () => {
    const usage = { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11, cached_tokens: 0 };
    const { settled } = await giveUpThenAnswer(12, (request) =>
      answer(request.attemptId, 200, "text/event-stream", "data: [DONE]\n\n", {
        id: request.attemptId,
        outcome: "ok",
        usage,
      }),
    );
    expect(settled).toMatchObject({ outcome: "ok", origin: "stand-in", usage });
  });

  it("bills an attempt that failed at an origin it does not name for what its region generated", async () => {
    const region = config.regions[0];
    if (region === undefined) throw new Error("no region");
    const requestId = `req_unnamed${crypto.randomUUID().replaceAll("-", "")}`;
    const gaveUp: GivenUp[] = [];
    const refused = dispatchCompletion({
      requestId,
      path: "/v1/chat/completions",
      body: JSON.stringify(chatBody({ stream: true, max_tokens: 4_000 })),
      model: "warmgate-sim-8b",
      candidates: region.origins.slice(0, 1).map((origin) => ({ region, origin })),
      pool: new OriginPool(),
      limits: config.limits,
      delivery: "stream",
      headers: {},
      secrets: env,
      gaveUp,
      onSettled: () => {},
      // As a Batcher that sent the item and then failed, naming no origin.
      open: async (candidate, request) => {
        const attempt = await openDirect(candidate, request);
        if (attempt.kind !== "open") return attempt;
        const reader = attempt.item.stream(() => {}).body.getReader();
        for (let i = 0; i < 4; i++) await reader.read();
        await reader.cancel();
        return {
          kind: "failed",
          failure: "unavailable",
          detail: "lost",
          originId: null,
          mayHaveRun: true,
        };
      },
    });
    await expect(refused).rejects.toMatchObject({ status: 503 });
    expect(gaveUp.map((attempt) => [attempt.origin.id, attempt.itemId])).toEqual([
      ["meter-slow-1", requestId],
    ]);
    const record = { requestId, model: "warmgate-sim-8b", outcome: "error" as const, usage: null };
    const unserved = { ...record, region: null, origin: null, status: 503, originBegan: false };
    const billed = await unservedUsage(unserved, gaveUp, env);
    const generated = await generatedFirst(requestId);
    expect(generated).toBeGreaterThan(0);
    expect(billed).toMatchObject({ origin: "meter-slow-1", originBegan: true });
    expect(billed.usage?.completion_tokens).toBe(generated);
  });

  it("names each attempt once across a model fallback's dispatches", async () => {
    const region = config.regions[0];
    if (region === undefined) throw new Error("no region");
    const requestId = `req_fallback${crypto.randomUUID().replaceAll("-", "")}`;
    const attempts: { region: string; origin: string; result: "failed" | "served" }[] = [];
    const ids: string[] = [];
    const fail = async (_: unknown, request: AttemptRequest): Promise<DispatchAttempt> => {
      ids.push(request.attemptId);
      return { kind: "failed", failure: "bad_answer", detail: "no", originId: null };
    };
    for (let model = 0; model < 2; model++) {
      const dispatched = dispatchCompletion({
        requestId,
        path: "/v1/chat/completions",
        body: "{}",
        model: "warmgate-sim-8b",
        candidates: region.origins.map((origin) => ({ region, origin })),
        pool: new OriginPool(),
        limits: config.limits,
        delivery: "whole",
        headers: {},
        secrets: env,
        attempts,
        onSettled: () => {},
        open: fail,
      });
      await expect(dispatched).rejects.toMatchObject({ status: 502 });
    }
    expect(ids).toEqual([requestId, `${requestId}.1`, `${requestId}.2`, `${requestId}.3`]);
  });
});
