/**
 * Reading JSON request bodies: the content type, a size limit and JSON syntax, each
 * failure an OpenAI-shaped 400 or 413. The admin and token routes then validate with zod
 * here (an empty body counts as `{}`; a failure has the code OpenAI's validation gives it);
 * the completion routes with their own schemas.
 * See docs/edge.md.
 */
import type { z } from "zod";
import { ApiError, bodyTooLarge, clipped, invalidJson } from "../../contracts/errors.ts";
import { concatBytes } from "../../contracts/protocol/framing.ts";
import { FIRST_ISSUE, validationError } from "./validation-errors.ts";

/** Largest body the admin and token routes read. */
export const MAX_SMALL_BODY_BYTES = 64 * 1024;

// `application/json`, with parameters, or any `+json` type (RFC 6839).
const JSON_TYPE = /^application\/(?:[\w.-]+\+)?json\s*(?:;|$)/i;

/** OpenAI's 400 for a body that is not declared JSON. */
export function unsupportedContentType(type: string): ApiError {
  const shown = clipped(type);
  return new ApiError(
    400,
    `Unsupported content type: '${shown}'. This API method only accepts 'application/json' requests, but you specified the header 'Content-Type: ${shown}'. Please try again with a supported content type.`,
    { type: "invalid_request_error", code: "unsupported_content_type" },
  );
}

/** Throws {@link unsupportedContentType} unless the request declares a JSON body. */
export function requireJsonType(request: Request): void {
  const type = request.headers.get("content-type") ?? "";
  if (!JSON_TYPE.test(type)) throw unsupportedContentType(type);
}

/** Reads a body up to `limit` bytes; throws 413 as soon as it is exceeded. */
export async function readBodyText(request: Request, limit: number): Promise<string> {
  const declared = Number(request.headers.get("content-length") ?? Number.NaN);
  if (declared > limit) throw bodyTooLarge(limit);
  if (request.body === null) return "";
  // A declared length within the limit is all the body there is (HTTP framing holds it to
  // that): read it in one go. Without one (chunked), count as the chunks come.
  if (Number.isSafeInteger(declared) && declared >= 0) {
    return decodeUtf8(new Uint8Array(await request.arrayBuffer()));
  }
  const chunks: Uint8Array[] = [];
  let total = 0;
  const reader = request.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > limit) {
      await reader.cancel().catch(() => {});
      throw bodyTooLarge(limit);
    }
    chunks.push(value);
  }
  return decodeUtf8(concatBytes(chunks, total));
}

// One decoder for every body: without `stream`, each `decode` starts afresh.
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

function decodeUtf8(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    throw invalidJson();
  }
}

/**
 * Parses and validates a small JSON request body; throws {@link ApiError} on bad input. A
 * request without a body is `{}`; one with a body must declare `application/json`.
 */
export async function readJsonBody<S extends z.ZodType>(
  request: Request,
  schema: S,
): Promise<z.infer<S>> {
  const text = await readBodyText(request, MAX_SMALL_BODY_BYTES);
  let raw: unknown = {};
  if (text.trim() !== "") {
    requireJsonType(request);
    try {
      raw = JSON.parse(text);
    } catch {
      throw invalidJson();
    }
  }
  const parsed = schema.safeParse(raw, FIRST_ISSUE);
  if (parsed.success) return parsed.data;
  // As OpenAI's own validation words the same issue (message, `param` path and code).
  throw validationError(parsed.error.issues);
}
