/**
 * The client side of the batch protocol as tests use it: post an envelope, read the
 * frames back, and group them per item.
 */
import { BATCH_PATH } from "../../contracts/protocol/schema.ts";
import { FrameType, readFrames } from "../../contracts/protocol/framing.ts";
import type {
  BatchItem,
  ItemHead,
  ItemTrailer,
  KvEventCursor,
  LoadReport,
} from "../../contracts/protocol/schema.ts";

/** One item's frames, as the client saw them. */
export interface ItemFrames {
  head: ItemHead | null;
  data: Uint8Array[];
  end: ItemTrailer | null;
  /** Frame kinds in arrival order, e.g. HEAD, DATA, DATA, END. */
  order: string[];
}

/** A whole batch response, decoded. */
export interface BatchResult {
  items: Map<number, ItemFrames>;
  loads: LoadReport[];
  /** Frame kinds of the whole response in order ("LOAD", "HEAD:0", …). */
  sequence: string[];
}

const NAMES: Record<number, string> = { 1: "HEAD", 2: "DATA", 3: "END", 4: "LOAD" };

/** Posts a batch envelope. */
export function postBatch(
  url: string,
  batchId: string,
  items: BatchItem[],
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`${url}${BATCH_PATH}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ v: 1, batch_id: batchId, items }),
    signal,
  });
}

/** Reads a batch response to its end; `onFrame` sees each item frame as it arrives. */
export async function readBatch(
  response: Response,
  onFrame?: (kind: string, item: number) => void,
): Promise<BatchResult> {
  if (response.body === null) throw new Error("batch response has no body");
  const result: BatchResult = { items: new Map(), loads: [], sequence: [] };
  for await (const frame of readFrames(response.body)) {
    const kind = NAMES[frame.type] ?? "?";
    if (frame.type === FrameType.LOAD) {
      result.loads.push(frame.report);
      result.sequence.push("LOAD");
      continue;
    }
    result.sequence.push(`${kind}:${frame.item}`);
    let item = result.items.get(frame.item);
    if (item === undefined) {
      item = { head: null, data: [], end: null, order: [] };
      result.items.set(frame.item, item);
    }
    item.order.push(kind);
    if (frame.type === FrameType.HEAD) item.head = frame.head;
    if (frame.type === FrameType.DATA) item.data.push(frame.payload.slice());
    if (frame.type === FrameType.END) item.end = frame.trailer;
    onFrame?.(kind, frame.item);
  }
  return result;
}

/** An item's body bytes joined, as text. */
export function itemText(item: ItemFrames | undefined): string {
  if (item === undefined) return "";
  return Buffer.concat(item.data).toString("utf8");
}

/** Polls `check` until it holds (tests wait for effects, never for a duration). */
export async function eventually(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (check()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`timed out waiting for: ${what}`);
}

/** Like {@link eventually}, for checks that must ask over the network. */
export async function eventuallyAsync(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`timed out waiting for: ${what}`);
}

/**
 * Applies the block events of a call's LOAD frames, in order, to a set of edge block
 * hashes; answers the cursor after the last.
 */
export function applyKvEvents(
  held: Set<number>,
  loads: readonly LoadReport[],
  cursor: KvEventCursor = { log: "", seq: 0 },
): KvEventCursor {
  let at = cursor;
  for (const load of loads) {
    const events = load.kv_events;
    if (events === undefined) continue;
    if (events.cleared) held.clear();
    for (const hash of events.removed) held.delete(hash);
    for (const hash of events.stored) held.add(hash);
    at = { log: events.log, seq: events.seq };
  }
  return at;
}
