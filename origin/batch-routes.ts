/**
 * The batch protocol's routes on an origin (origin/PROTOCOL.md): `POST /v1/batch` runs
 * each item on the engine and streams their frames back multiplexed with load reports;
 * `/v1/batch/cancel` stops items; `/v1/batch/outcomes` tells how recent items ended.
 */
import type { Context, Hono } from "hono";
import {
  BATCH_CANCEL_PATH,
  BATCH_PATH,
  BATCH_PROTOCOL_VERSION,
  type BatchItem,
  BatchRequestSchema,
  CancelRequestSchema,
  OUTCOMES_PATH,
  OutcomesRequestSchema,
  type ItemHead,
  type KvEventCursor,
  type LoadReport,
} from "../contracts/protocol/schema.ts";
import {
  BATCH_CONTENT_TYPE,
  BATCH_ITEM,
  RAW_BATCH_CONTENT_TYPE,
  FrameType,
  concatBytes,
  encodeFrame,
  encodeJsonFrame,
} from "../contracts/protocol/framing.ts";
import type { ItemRun, ItemRunner, ItemSpec } from "./items.ts";
import type { OriginCounters } from "./metrics.ts";
import { OriginError, breakConnection, readJson, zodMessage } from "./http.ts";
import { EnvelopeError, decodeEnvelope } from "../contracts/protocol/envelope.ts";

/** Backpressure threshold of a batch response: beyond it, items wait for the edge to read. */
const BATCH_HIGH_WATER_BYTES = 1 << 20;

/** What the batch routes share with the rest of the origin. */
export interface BatchRouteDeps {
  items: ItemRunner;
  /** Running batches by id: each item's run by item id. */
  batches: Map<string, Map<string, ItemRun>>;
  counters: OriginCounters;
  originId: string;
  loadIntervalMs: number;
  maxBatchItems: number;
  /** The origin's load now, with its block events after `cursor` when one is given. */
  loadReport: (cursor?: KvEventCursor) => LoadReport;
}

/** Adds the batch routes to the origin's app. */
export function batchRoutes(app: Hono, deps: BatchRouteDeps): void {
  app.post(BATCH_PATH, async (c) => {
    const parsed = BatchRequestSchema.safeParse(await readEnvelope(c));
    if (!parsed.success) {
      const { message, param } = zodMessage(parsed.error);
      throw new OriginError(400, message, "invalid_batch", param);
    }
    const envelope = parsed.data;
    if (envelope.items.length > deps.maxBatchItems) {
      throw new OriginError(
        400,
        `A batch holds at most ${deps.maxBatchItems} items; got ${envelope.items.length}.`,
        "batch_too_large",
        "items",
      );
    }
    const raw = envelope.raw === true;
    if (raw && envelope.items.length !== 1) {
      throw new OriginError(400, "A raw batch holds exactly one item.", "invalid_batch", "raw");
    }
    const seen = new Set<string>();
    for (const item of envelope.items) {
      if (seen.has(item.id)) {
        throw new OriginError(400, `Duplicate item id: ${item.id}`, "duplicate_item_id", "items");
      }
      seen.add(item.id);
    }
    if (deps.batches.has(envelope.batch_id)) {
      throw new OriginError(
        409,
        `Batch ${envelope.batch_id} is already running.`,
        "batch_conflict",
      );
    }
    deps.counters.batches++;
    if (raw) deps.counters.rawBatches++;
    deps.counters.batchItems += envelope.items.length;
    const runs = new Map<string, ItemRun>();
    deps.batches.set(envelope.batch_id, runs);
    // A cancel that overtook its batch stops its items before they reach the engine.
    const now = Date.now();
    const batchCancelled = deps.items.cancels.take(batchKey(envelope.batch_id), now);
    for (const item of envelope.items) {
      const run = deps.items.newRun();
      runs.set(item.id, run);
      if (batchCancelled || deps.items.cancels.take(itemKey(item.id), now)) {
        deps.items.abortItem(run, "cancel");
      }
    }

    const batchSignal = c.req.raw.signal;
    let closed = false;
    let waiters: (() => void)[] = [];
    let ticker: ReturnType<typeof setInterval> | undefined;
    const release = () => {
      const pending = waiters;
      waiters = [];
      for (const wake of pending) wake();
    };
    const dropBatch = () => {
      if (closed) return;
      closed = true;
      release();
      for (const run of runs.values()) deps.items.abortItem(run, "client");
    };

    const stream = new ReadableStream<Uint8Array>(
      {
        start(controller) {
          // Frames emitted in one turn of the event loop leave as one chunk: the items of a
          // batch produce their tokens at the same engine step, and the reader pays per
          // chunk (one read and one hop each), not per byte. They wait one turn at most.
          let queued: Uint8Array[] = [];
          const sendQueued = () => {
            const frames = queued;
            queued = [];
            if (closed || frames.length === 0) return;
            controller.enqueue(concatBytes(frames));
          };
          const emit = async (frame: Uint8Array): Promise<void> => {
            if (closed) return;
            if (queued.push(frame) === 1) setImmediate(sendQueued);
            // Backpressure: past the high-water mark, wait until the edge reads.
            if ((controller.desiredSize ?? 1) <= 0) {
              await new Promise<void>((resolve) => waiters.push(resolve));
            }
          };
          // Each LOAD brings the block events since the one before it on this call.
          let cursor = envelope.kv_events_after;
          const emitLoad = () => {
            const report = deps.loadReport(cursor);
            if (report.kv_events !== undefined) {
              cursor = { log: report.kv_events.log, seq: report.kv_events.seq };
            }
            return emit(encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, report));
          };

          const runOne = async (index: number, item: BatchItem) => {
            const run = runs.get(item.id);
            if (run === undefined) return;
            const spec: ItemSpec = {
              id: item.id,
              path: item.path,
              body: item.body,
              headers: Object.fromEntries(
                Object.entries(item.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v]),
              ),
              priority: item.priority ?? 0,
              background: item.background === true,
            };
            if (item.timeout_ms !== undefined) spec.timeoutMs = item.timeout_ms;
            const opened = await deps.items.openItem(spec, run);
            const head: ItemHead = { id: item.id, status: opened.status, headers: opened.headers };
            // Raw: the HEAD is the last frame, its body follows as the engine wrote it.
            if (raw) clearInterval(ticker);
            await emit(encodeJsonFrame(FrameType.HEAD, index, head));
            for (;;) {
              let next: IteratorResult<Uint8Array>;
              try {
                next = await opened.body.next();
              } catch {
                break;
              }
              if (next.done === true) break;
              await emit(raw ? next.value : encodeFrame(FrameType.DATA, index, next.value));
            }
            // A raw answer's END is its outcome record, kept before its body ends.
            const trailer = await opened.finish();
            if (!raw) {
              await emit(encodeJsonFrame(FrameType.END, index, trailer));
            } else if (trailer.outcome !== "ok" && head.status < 400) {
              // Cut: its body must not end whole. Its bytes go first, then the connection.
              sendQueued();
              closed = true;
              await breakConnection(
                c,
                () => (controller.desiredSize ?? 0) >= BATCH_HIGH_WATER_BYTES,
              );
            }
          };

          const work = async () => {
            await emitLoad();
            ticker = setInterval(() => void emitLoad(), deps.loadIntervalMs);
            await Promise.all(envelope.items.map((item, index) => runOne(index, item)));
            clearInterval(ticker);
            if (!raw) await emitLoad();
            deps.batches.delete(envelope.batch_id);
            if (!closed) {
              sendQueued();
              closed = true;
              controller.close();
            }
          };
          work().catch(() => {
            // Only a bug lands here; end the batch rather than leave the edge waiting.
            clearInterval(ticker);
            deps.batches.delete(envelope.batch_id);
            dropBatch();
            controller.error(new Error("batch failed"));
          });
        },
        pull() {
          release();
        },
        cancel() {
          clearInterval(ticker);
          dropBatch();
        },
      },
      new ByteLengthQueuingStrategy({ highWaterMark: BATCH_HIGH_WATER_BYTES }),
    );
    batchSignal.addEventListener("abort", dropBatch, { once: true });
    // The edge may have closed the call while its envelope was read.
    if (batchSignal.aborted) dropBatch();

    return new Response(stream, {
      status: 200,
      headers: {
        "content-type": raw ? RAW_BATCH_CONTENT_TYPE : BATCH_CONTENT_TYPE,
        "cache-control": "no-store",
        "warmgate-batch-version": String(BATCH_PROTOCOL_VERSION),
        "x-warmgate-origin": deps.originId,
      },
    });
  });

  app.post(BATCH_CANCEL_PATH, async (c) => {
    const parsed = CancelRequestSchema.safeParse(await readJson(c));
    if (!parsed.success) {
      const { message, param } = zodMessage(parsed.error);
      throw new OriginError(400, message, "invalid_cancel", param);
    }
    const { batch_id: batchId, ids } = parsed.data;
    const now = Date.now();
    const runs = batchId === undefined ? undefined : deps.batches.get(batchId);
    const cancelled: string[] = [];
    if (ids === undefined) {
      if (runs === undefined && batchId !== undefined) {
        deps.items.cancels.remember(batchKey(batchId), now);
      }
      for (const [id, run] of runs ?? []) {
        if (deps.items.abortItem(run, "cancel")) cancelled.push(id);
      }
      return c.json({ cancelled });
    }
    for (const id of ids) {
      // Named alone, an item is found in whichever batch runs it.
      const run = batchId === undefined ? runningItem(deps.batches, id) : runs?.get(id);
      if (run !== undefined) {
        if (deps.items.abortItem(run, "cancel")) cancelled.push(id);
      } else if (runs === undefined && !deps.items.outcomes.known(id)) {
        // Not here yet: its batch may still be on its way.
        deps.items.cancels.remember(itemKey(id), now);
      }
    }
    return c.json({ cancelled });
  });

  // How the items of given requests ended: an edge that lost them in a restart bills from it.
  app.post(OUTCOMES_PATH, async (c) => {
    const parsed = OutcomesRequestSchema.safeParse(await readJson(c));
    if (!parsed.success) {
      const { message, param } = zodMessage(parsed.error);
      throw new OriginError(400, message, "invalid_outcomes_request", param);
    }
    const { ids, prefixes } = parsed.data;
    deps.counters.outcomeLookups++;
    return c.json({ items: deps.items.outcomes.lookup(ids, Date.now(), prefixes) });
  });
}

/** The run of item `id` in whichever running batch holds it. */
function runningItem(batches: Map<string, Map<string, ItemRun>>, id: string): ItemRun | undefined {
  for (const runs of batches.values()) {
    const run = runs.get(id);
    if (run !== undefined) return run;
  }
  return undefined;
}

// Item and batch ids share the memory of early cancels, each in a namespace of its own.
const batchKey = (id: string) => `batch:${id}`;
const itemKey = (id: string) => `item:${id}`;

// The envelope of `POST /v1/batch`, as JSON or with its one item's body after it.
async function readEnvelope(c: Context): Promise<unknown> {
  const text = await c.req.text();
  try {
    return decodeEnvelope(c.req.header("content-type") ?? "", text);
  } catch (error) {
    if (!(error instanceof EnvelopeError)) throw error;
    if (error.syntax) throw new OriginError(400, error.message, "invalid_json");
    throw new OriginError(400, error.message, "invalid_batch", error.param ?? null);
  }
}
