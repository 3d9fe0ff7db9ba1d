/**
 * Drives one Batcher from the workers tests as the edge does (`open`, then `end`; `answer`)
 * over the simulated origins of `origins-setup.ts`, and reads what it answers as frames.
 */
import { env } from "cloudflare:workers";
import { expect, inject } from "vitest";
import { type Batcher } from "../../durable-objects/batcher/index.ts";
import {
  type BatcherAnswerResult,
  type BatcherHead,
  type BatcherOpenResult,
  type BatcherAttempt,
} from "../../durable-objects/batcher/types.ts";
import { type BreakerSettings, DEFAULT_BREAKER_SETTINGS } from "../../contracts/config/breakers.ts";
import type { BatcherSetup } from "../../contracts/config/plans.ts";
import { DEFAULT_BATCHING, type WindowConfigInput, windowConfig } from "./window-config.ts";
import type { FrameReader } from "../../contracts/upstream.ts";
import { z } from "zod";
import {
  ItemHeadSchema,
  type ItemTrailer,
  ItemTrailerSchema,
} from "../../contracts/protocol/schema.ts";
import {
  type Frame,
  FrameType,
  decodeFrame,
  encodeJsonPayload,
  parsePayload,
} from "../../contracts/protocol/framing.ts";
import { chatBody, metricValue } from "./edge-requests.ts";

// batch-1 and batch-2 are the Batcher tests' alone; they generate about one token per 20 ms, so a
// long request is still running while the next ones arrive.
export const origins = inject("testOrigins");
export function urlOf(id: string): string {
  const origin = origins.find((o) => o.id === id);
  if (origin === undefined) throw new Error(`${id} is not running`);
  return origin.url;
}

/** Settings under which a request that finds its origin busy waits up to a second. */
export const HOLD: Partial<WindowConfigInput> = { maxWindowMs: 1000, callIntervalMs: 1000 };

export type AttemptOverrides = Partial<Omit<BatcherAttempt, "body">> & {
  body?: Record<string, unknown>;
};

/**
 * A fresh batcher (its own name and counters) over the given origins; with `breakers`, its
 * origins' breakers are on under those settings, in a region of its own.
 */
export function batcher(
  window: Partial<WindowConfigInput> = {},
  ids: string[] = ["batch-1"],
  clientBacklogBytes = DEFAULT_BATCHING.clientBacklogBytes,
  { breakers }: { breakers?: BreakerSettings } = {},
) {
  const version = `test-${crypto.randomUUID().slice(0, 8)}`;
  const setup: BatcherSetup = {
    version,
    region: breakers === undefined ? "test" : `test-${version}`,
    breakers: {
      enabled: breakers !== undefined,
      settings: breakers ?? DEFAULT_BREAKER_SETTINGS,
    },
    routing: null,
    window: windowConfig({ ...window, origins: ids.map((id) => ({ id })) }),
    origins: ids.map((id) => ({ id, url: urlOf(id) })),
    quarantineMs: 1000,
    clientBacklogBytes,
  };
  const stub = env.BATCHER.getByName(`test:${setup.version}`);
  const input = (id: string, over: AttemptOverrides): BatcherAttempt => {
    const { body, ...rest } = over;
    return {
      setup,
      id,
      path: "/v1/chat/completions",
      body: JSON.stringify(chatBody({ stream: true, max_tokens: 4, ...body })),
      headers: { "x-request-id": id },
      lane: 0,
      promptTokens: 30,
      maxTokens: 4,
      deadline: Date.now() + 60_000,
      firstByteTimeoutMs: 10_000,
      itemTimeoutMs: 60_000,
      avoidOrigins: [],
      ...rest,
    };
  };
  // As the edge does: `end` right behind `open`.
  const open = (id: string, over: AttemptOverrides = {}) => openOn(stub, input(id, over));
  // A streamed item read as its frames: HEAD, DATA…, END.
  const stream = (id: string, over: AttemptOverrides = {}): FrameReader => {
    const { opening, ending } = open(id, over);
    return openedFrames(opening, ending);
  };
  // A JSON item, answered whole.
  const answer = (id: string, over: AttemptOverrides = {}): Promise<BatcherAnswerResult> =>
    stub.answer(input(id, { ...over, body: { stream: false, ...over.body } }));
  return { stub, setup, open, stream, answer };
}

/** `open` and, right behind it, `end`, as the edge calls them. */
export function openOn(stub: DurableObjectStub<Batcher>, input: BatcherAttempt) {
  const opening: Promise<BatcherOpenResult> = stub.open(input);
  const ending: Promise<Uint8Array | null> = stub.end(input.id).then((end) => end.trailer);
  // A test that never reads it leaves it to fail when a later test resets the objects.
  ending.catch(() => {});
  return { opening, ending };
}

export function frameOf(type: FrameType, payload: Uint8Array): Frame {
  return decodeFrame(type, 0, payload);
}

/** A Batcher's HEAD as its caller gets it: the origin's, plus which origin it is. */
const BatcherHeadSchema = ItemHeadSchema.extend({ origin: z.string() });

function batcherHeadOf(frame: Frame): BatcherHead {
  const head = parsePayload(BatcherHeadSchema, frame.payload);
  if (head === null) throw new Error("a HEAD without its origin");
  return head;
}

/** An END's trailer from its bytes, null without any; a malformed one fails the test. */
export function trailerOf(bytes: Uint8Array | null): ItemTrailer | null {
  if (bytes === null) return null;
  const trailer = parsePayload(ItemTrailerSchema, bytes);
  if (trailer === null) throw new Error("a malformed END trailer");
  return trailer;
}

/**
 * An opened item as frames: a HEAD from `open`, DATA from its body's reads, and the END
 * from `end`; or the lone END of an item that ended before its HEAD. Reading stops, with
 * why, when the item was cut, cancelled or lost.
 */
export function openedFrames(
  opening: Promise<BatcherOpenResult>,
  ending: Promise<Uint8Array | null>,
): FrameReader {
  let body: ReadableStreamDefaultReader<Uint8Array> | null = null;
  let phase: "opening" | "body" | "end" | "stopped" = "opening";
  let stopped = "";
  let cancelled = false;
  const stop = (why: unknown): string => {
    phase = "stopped";
    stopped = String(why);
    return stopped;
  };
  return {
    async next() {
      try {
        if (phase === "opening") {
          const result = await opening;
          switch (result.kind) {
            case "open":
              body = result.body.getReader();
              if (cancelled) void body.cancel().catch(() => {});
              phase = "body";
              return frameOf(FrameType.HEAD, encodeJsonPayload(result.head));
            case "ended":
              stop("after its lone END");
              // The whole failure trailer (`origin`, `status`…), not only an END's fields.
              return {
                type: FrameType.END,
                item: 0,
                payload: encodeJsonPayload(result.trailer),
                trailer: result.trailer,
              };
            case "cancelled":
              return stop("cancelled");
            default:
              throw new Error(`expected open, got ${result.kind}`);
          }
        }
        if (phase === "body" && body !== null) {
          const chunk = await body.read();
          if (!chunk.done) return frameOf(FrameType.DATA, chunk.value);
          phase = "end";
        }
        if (phase === "end") {
          const trailer = await ending;
          if (trailer === null) return stop("ended without END");
          stop("after END");
          return frameOf(FrameType.END, trailer);
        }
        return stopped;
      } catch (error) {
        if (phase === "opening" && error instanceof Error && error.message.startsWith("expected")) {
          throw error;
        }
        return stop(error);
      }
    },
    takeReadyData: () => undefined,
    cancel() {
      cancelled = true;
      if (body !== null) void body.cancel().catch(() => {});
    },
  };
}

export interface ReadItem {
  head: BatcherHead | null;
  body: Uint8Array;
  trailer: ItemTrailer | null;
  /** Why reading stopped when no END came. */
  stopped: string | null;
}

/** Reads an item's frames to the end. */
export async function readItem(frames: FrameReader): Promise<ReadItem> {
  const out: ReadItem = { head: null, body: new Uint8Array(), trailer: null, stopped: null };
  for (;;) {
    const frame = await frames.next();
    if (typeof frame === "string") {
      out.stopped = frame;
      return out;
    }
    if (frame.type === FrameType.HEAD) out.head = batcherHeadOf(frame);
    if (frame.type === FrameType.DATA) out.body = concat(out.body, frame.payload);
    if (frame.type === FrameType.END) {
      out.trailer = frame.trailer;
      return out;
    }
  }
}

/** Reads frames until the item's HEAD. */
export async function untilHead(frames: FrameReader): Promise<BatcherHead> {
  for (;;) {
    const frame = await frames.next();
    if (typeof frame === "string") throw new Error(`no HEAD: ${frame}`);
    if (frame.type === FrameType.HEAD) return batcherHeadOf(frame);
    if (frame.type === FrameType.END) {
      throw new Error(`END before HEAD: ${new TextDecoder().decode(frame.payload)}`);
    }
  }
}

export function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.byteLength + b.byteLength);
  out.set(a);
  out.set(b, a.byteLength);
  return out;
}

export interface OriginCounts {
  batches: number;
  items: number;
  inFlight: number;
  cancelled: number;
  dropped: number;
}

export async function counts(id: string): Promise<OriginCounts> {
  const text = await (await fetch(`${urlOf(id)}/metrics`)).text();
  return {
    batches: metricValue(text, "warmgate_origin_batches_total"),
    items: metricValue(text, "warmgate_origin_batch_items_total"),
    inFlight: metricValue(text, "warmgate_origin_items_in_flight"),
    cancelled: metricValue(text, "warmgate_origin_cancellations_total", 'reason="cancel"'),
    dropped: metricValue(text, "warmgate_origin_cancellations_total", 'reason="client"'),
  };
}

/** Polls an origin until `done` holds (the origin learns of cancels asynchronously). */
export async function waitForCounts(
  id: string,
  done: (c: OriginCounts) => boolean,
): Promise<OriginCounts> {
  let current = await counts(id);
  for (let i = 0; i < 200 && !done(current); i++) {
    await new Promise((resolve) => setTimeout(resolve, 25));
    current = await counts(id);
  }
  return current;
}

/** The origin's counts once items of earlier tests have left it (it cancels asynchronously). */
export function quiet(id: string): Promise<OriginCounts> {
  return waitForCounts(id, (c) => c.inFlight === 0);
}

/** The same request straight to batch-1's own OpenAI route, as bytes. */
export async function direct(body: Record<string, unknown>, id = "batch-1"): Promise<Uint8Array> {
  const res = await fetch(`${urlOf(id)}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return new Uint8Array(await res.arrayBuffer());
}

/** Lets go of an item: the cancel RPC, then its body. */
export async function release(b: ReturnType<typeof batcher>, id: string, frames: FrameReader) {
  await b.stub.cancel(id);
  frames.cancel();
}

/** Starts a long request that keeps the origin busy; returns its frames once it runs. */
export async function occupy(b: ReturnType<typeof batcher>, id = "occupier"): Promise<FrameReader> {
  const frames = b.stream(id, { body: { max_tokens: 2000 }, maxTokens: 2000 });
  await untilHead(frames);
  return frames;
}

export async function untilQueued(b: ReturnType<typeof batcher>, n: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await b.stub.snapshot()).queued === n) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error(`never ${n} queued`);
}

/** Sets an origin's injected faults; null clears them. */
export async function setFaults(id: string, faults: Record<string, unknown> | null): Promise<void> {
  const res = await fetch(`${urlOf(id)}/admin/faults`, {
    method: faults === null ? "DELETE" : "PUT",
    headers: { "content-type": "application/json" },
    ...(faults !== null && { body: JSON.stringify(faults) }),
  });
  expect(res.ok).toBe(true);
  await res.arrayBuffer();
}

/** An item `open` opened: its body, and its END trailer (null when none came). */
export async function opened(b: ReturnType<typeof batcher>, id: string, over: AttemptOverrides) {
  const { opening, ending } = b.open(id, over);
  const result = await opening;
  if (result.kind !== "open") throw new Error(`expected open, got ${result.kind}`);
  const trailer = async (): Promise<ItemTrailer | null> => trailerOf(await ending);
  return { head: result.head, body: result.body, trailer };
}
