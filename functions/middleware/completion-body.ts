/**
 * The validator of completion bodies: JSON content type, the configured size limit, JSON
 * syntax, then the OpenAI schema. It keeps the exact body text: that, not a
 * re-serialisation, is what the origin receives.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv, CompletionBody } from "../app-env.ts";
import { ApiError, bodyTooLarge, invalidJson } from "../errors.ts";
import { ChatCompletionRequestSchema, CompletionRequestSchema } from "../openai-schemas.ts";
import { validationError } from "../validation-errors.ts";
import { concatBytes } from "../../origin/protocol.ts";

// `application/json`, with parameters, or any `+json` type (RFC 6839).
const JSON_TYPE = /^application\/(?:[\w.-]+\+)?json\s*(?:;|$)/i;

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

function unsupportedContentType(type: string): ApiError {
  return new ApiError(
    400,
    `Unsupported content type: '${type}'. This API method only accepts 'application/json' requests, but you specified the header 'Content-Type: ${type}'. Please try again with a supported content type.`,
    { type: "invalid_request_error", code: "unsupported_content_type" },
  );
}

/** Validates the body of `/v1/chat/completions` (`chat`) or `/v1/completions` (`completion`). */
export function completionBody(kind: CompletionBody["kind"]) {
  return createMiddleware<AppEnv>(async function validateCompletionBody(c, next) {
    const type = c.req.header("content-type") ?? "";
    if (!JSON_TYPE.test(type)) throw unsupportedContentType(type);
    const text = await readBodyText(c.req.raw, c.var.config.limits.max_body_bytes);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw invalidJson();
    }
    if (kind === "chat") {
      const result = ChatCompletionRequestSchema.safeParse(json, { reportInput: true });
      if (!result.success) throw validationError(result.error.issues);
      c.set("completion", { kind, body: result.data, text });
    } else {
      const result = CompletionRequestSchema.safeParse(json, { reportInput: true });
      if (!result.success) throw validationError(result.error.issues);
      c.set("completion", { kind, body: result.data, text });
    }
    await next();
  });
}
