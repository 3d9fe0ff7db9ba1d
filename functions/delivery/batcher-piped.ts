/**
 * A streamed attempt through the region's `Batcher` once it opened (docs/batching.md,
 * "Callers"): the Batcher streams the body to the client itself, and the edge reads only
 * the item's END, to settle the request.
 */
import type { BatcherCancelOptions, BatcherEnd } from "../../durable-objects/batcher/types.ts";
import { type ItemHead, ItemTrailerSchema } from "../../contracts/protocol/schema.ts";
import { parsePayload } from "../../contracts/protocol/framing.ts";
import { describe } from "../../contracts/upstream.ts";
import type { ItemEnd, OpenItem } from "./item.ts";

/**
 * A streamed item whose body the Batcher streams to the client itself: the edge hands the
 * body over as it is and reads only the END, to settle the request. The Batcher writes the
 * error event of a failure after the HEAD, and cancels the item when its body is left.
 */
export function pipedItem(
  head: ItemHead,
  body: ReadableStream<Uint8Array>,
  ended: Promise<ItemEnd>,
  firstByte: Promise<number | null>,
  tell: (options?: BatcherCancelOptions) => void,
): OpenItem {
  // Known once the END is: the Batcher streams the body, so it says when it began.
  let firstByteAt: number | null = null;
  void firstByte.then((at) => {
    firstByteAt = at;
  });
  return {
    head,
    stream: () => ({
      body,
      ended: ended.then(async (end) => {
        await firstByte;
        return end;
      }),
      clientGone: () => tell({ untilEnd: true }),
      timeOut: () => tell({ timedOut: true }),
      firstByteAt: () => firstByteAt,
    }),
    async whole() {
      let bytes = new Uint8Array();
      try {
        bytes = new Uint8Array(await new Response(body).arrayBuffer());
      } catch {
        // A body cut short: the END, or its absence, says how the item ended.
      }
      return { body: bytes, end: await ended };
    },
    cancel() {
      body.cancel().catch(() => {});
      tell();
    },
  };
}

/** The END that `end` answers, as how the item ended. */
export async function endOf(ending: Promise<BatcherEnd>): Promise<ItemEnd> {
  try {
    const { trailer } = await ending;
    // Null: the item's call was cut after its HEAD, or the batcher lost the item.
    if (trailer === null) return { kind: "broken", detail: "the item ended without an END" };
    const read = parsePayload(ItemTrailerSchema, trailer);
    if (read === null) return { kind: "broken", detail: "batcher: malformed END trailer" };
    return { kind: "end", trailer: read };
  } catch (error) {
    return { kind: "broken", detail: `batcher: ${describe(error)}` };
  }
}
