/**
 * How an envelope travels to an origin (origin/PROTOCOL.md, "The envelope"): as JSON, or,
 * holding one item, as JSON without the item's body followed by a line feed and the body as
 * the client sent it, so that neither side escapes or unescapes a prompt of hundreds of
 * kilobytes to carry it. Pure: the edge encodes, the origin (and test origins) decode.
 */
import type { BatchRequest } from "./schema.ts";

/** Media type of an envelope of one item with the item's body after it. */
export const ITEM_BODY_ENVELOPE_CONTENT_TYPE = "application/x-warmgate-envelope-body";

/** An envelope as the request that carries it: its media type and body. */
export interface EncodedEnvelope {
  contentType: string;
  body: string;
}

/**
 * The request body of `batch`: one item's body after the envelope (JSON text has no raw
 * line feed, so the first one ends it), several items' bodies inside it.
 */
export function encodeEnvelope(batch: BatchRequest): EncodedEnvelope {
  const [item] = batch.items;
  if (item === undefined || batch.items.length > 1) {
    return { contentType: "application/json", body: JSON.stringify(batch) };
  }
  const { body, ...rest } = item;
  return {
    contentType: ITEM_BODY_ENVELOPE_CONTENT_TYPE,
    body: `${JSON.stringify({ ...batch, items: [rest] })}\n${body}`,
  };
}

/** Why a request body is no envelope: `param` names what is wrong, `syntax` a JSON error. */
export class EnvelopeError extends Error {
  readonly param: string | undefined;
  readonly syntax: boolean;
  constructor(message: string, options: { param?: string; syntax?: boolean } = {}) {
    super(message);
    this.param = options.param;
    this.syntax = options.syntax ?? false;
  }
}

/**
 * The envelope a request body of media type `contentType` carries, its item's body put back
 * in place, still to be checked against its schema; throws {@link EnvelopeError}.
 */
export function decodeEnvelope(contentType: string, text: string): unknown {
  if (!contentType.toLowerCase().startsWith(ITEM_BODY_ENVELOPE_CONTENT_TYPE)) {
    return parse(text);
  }
  const cut = text.indexOf("\n");
  if (cut < 0) {
    throw new EnvelopeError("The item's body must follow the envelope after a line feed.", {
      param: "items.0.body",
    });
  }
  const envelope = parse(text.slice(0, cut));
  const list: unknown =
    typeof envelope === "object" && envelope !== null && "items" in envelope
      ? envelope.items
      : undefined;
  const item: unknown = Array.isArray(list) && list.length === 1 ? list[0] : undefined;
  if (typeof item !== "object" || item === null) {
    throw new EnvelopeError("An envelope followed by its item's body holds exactly one item.", {
      param: "items",
    });
  }
  if ("body" in item) {
    throw new EnvelopeError("The item's body follows the envelope; the item has none inside it.", {
      param: "items.0.body",
    });
  }
  (item as Record<string, unknown>).body = text.slice(cut + 1);
  return envelope;
}

function parse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new EnvelopeError("The request body is not valid JSON.", { syntax: true });
  }
}
