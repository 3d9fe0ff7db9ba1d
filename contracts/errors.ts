/**
 * Typed errors of the request path and the one OpenAI error shape they become.
 *
 * Handlers and middleware throw {@link ApiError}; only `app.onError`, `notFound` and the
 * stream's mid-flight error event turn it into `{"error":{message,type,param,code}}`.
 * See docs/edge.md, "Errors".
 */
import type { ContentfulStatusCode } from "hono/utils/http-status";

/** OpenAI's error `type` values that the edge produces. */
export type ApiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "rate_limit_error"
  /** OpenAI's `type` of a 429 on a requests-per-minute limit. */
  | "requests"
  /** OpenAI's `type` of a 429 on a tokens-per-minute limit. */
  | "tokens"
  | "insufficient_quota"
  | "server_error";

/** The body of every error response, exactly OpenAI's shape. */
export interface OpenAIErrorBody {
  error: { message: string; type: ApiErrorType; param: string | null; code: string | null };
}

/** Options of an {@link ApiError}. */
export interface ApiErrorOptions {
  type: ApiErrorType;
  param?: string | null;
  code?: string | null;
  /** Extra response headers (`allow`, `retry-after`, …). */
  headers?: Record<string, string>;
}

/** An error the client is meant to see, with OpenAI's status, type, param and code. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly status: ContentfulStatusCode;
  readonly type: ApiErrorType;
  readonly param: string | null;
  readonly code: string | null;
  readonly headers: Record<string, string>;

  constructor(status: ContentfulStatusCode, message: string, options: ApiErrorOptions) {
    super(message);
    this.status = status;
    this.type = options.type;
    this.param = options.param ?? null;
    this.code = options.code ?? null;
    this.headers = options.headers ?? {};
  }

  /** The OpenAI error body for this error. */
  toBody(): OpenAIErrorBody {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

/** 400 for a bad request field; `param` is OpenAI's path, e.g. `messages[0].role`. */
export function invalidRequest(message: string, param: string | null, code: string | null) {
  return new ApiError(400, message, { type: "invalid_request_error", param, code });
}

/** OpenAI answers a body it cannot parse with exactly this 400 (param and code null). */
export function invalidJson(): ApiError {
  return invalidRequest(
    "We could not parse the JSON body of your request. The API expects a JSON payload, but what was sent was not valid JSON.",
    null,
    null,
  );
}

/** 401 for a missing key; OpenAI's wording, without ever echoing a key. */
export function missingApiKey(): ApiError {
  return new ApiError(
    401,
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
    { type: "invalid_request_error", code: "invalid_api_key" },
  );
}

/** 401 for an unknown key; unlike OpenAI the key is not echoed, so it never reaches logs. */
export function incorrectApiKey(): ApiError {
  return new ApiError(401, "Incorrect API key provided.", {
    type: "invalid_request_error",
    code: "invalid_api_key",
  });
}

/** Most characters of a client's input that an error message quotes. */
export const MAX_QUOTED_CHARS = 200;

/**
 * `text` cut to {@link MAX_QUOTED_CHARS} with an ellipsis and its length, so an error about
 * a huge field stays small (a 2 MB `role` gives a 300-byte message).
 */
export function clipped(text: string): string {
  if (text.length <= MAX_QUOTED_CHARS) return text;
  return `${text.slice(0, MAX_QUOTED_CHARS)}… (${text.length} characters)`;
}

/** 404 with OpenAI's wording for a model that is not served. */
export function modelNotFound(model: string): ApiError {
  return new ApiError(
    404,
    `The model \`${clipped(model)}\` does not exist or you do not have access to it.`,
    { type: "invalid_request_error", param: "model", code: "model_not_found" },
  );
}

/** OpenAI's 404 for an unknown route: `Invalid URL (POST /v1/foo)`. */
export function invalidUrl(method: string, path: string): ApiError {
  return new ApiError(404, `Invalid URL (${method} ${clipped(path)})`, {
    type: "invalid_request_error",
  });
}

/** OpenAI's 405 for a known route with the wrong method, plus the `allow` header (RFC 9110 §15.5.6). */
export function invalidMethod(method: string, path: string, allow: readonly string[]): ApiError {
  return new ApiError(405, `Invalid method for URL (${method} ${clipped(path)})`, {
    type: "invalid_request_error",
    headers: { allow: allow.join(", ") },
  });
}

/** 413 for a body over the configured limit. */
export function bodyTooLarge(limit: number): ApiError {
  return new ApiError(413, `Request body too large: the limit is ${limit} bytes.`, {
    type: "invalid_request_error",
    code: "request_too_large",
  });
}

/** vLLM's and OpenAI's 400 when prompt plus completion exceed the model's window. */
export function contextLengthExceeded(
  maxModelLen: number,
  promptTokens: number,
  completionTokens: number,
  param: "messages" | "prompt" | "input",
): ApiError {
  return invalidRequest(
    `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${promptTokens + completionTokens} tokens (${promptTokens} in the ${param}, ${completionTokens} in the completion). Please reduce the length of the ${param} or completion.`,
    param,
    "context_length_exceeded",
  );
}

/** Why no origin answered the request before its first byte. */
export type OriginFailureKind = "unavailable" | "bad_answer" | "timeout";

const ORIGIN_FAILURES = {
  unavailable: [
    503,
    "No healthy origin is available to serve this model right now.",
    "no_healthy_origin",
  ],
  bad_answer: [502, "The origin server failed to process the request.", "origin_error"],
  timeout: [504, "The origin server did not answer in time.", "origin_timeout"],
} as const satisfies Record<OriginFailureKind, readonly [ContentfulStatusCode, string, string]>;

/**
 * 502/503/504 for origins that failed before the first byte reached the client; a 503
 * always says when to come back (`retry-after`, 1 s unless the caller sets a later time).
 */
export function originFailure(kind: OriginFailureKind): ApiError {
  const [status, message, code] = ORIGIN_FAILURES[kind];
  return new ApiError(status, message, {
    type: "server_error",
    code,
    ...(kind === "unavailable" && { headers: { "retry-after": "1" } }),
  });
}

function stringOr(value: unknown): string {
  return typeof value === "string" ? value : "";
}

/**
 * The answer to a request that failed the same way on two origins: the request's fault, not
 * theirs (docs/failover.md, "Requests that fail everywhere"). 400 with the engine's message
 * where its error says the input was bad, otherwise 502; no origin is blamed for it.
 */
export function failedEverywhere(engineBody: string): ApiError {
  let error: { message?: unknown; type?: unknown; code?: unknown } | undefined;
  try {
    error = (JSON.parse(engineBody) as { error?: typeof error }).error;
  } catch {
    error = undefined;
  }
  const kind = `${stringOr(error?.type)} ${stringOr(error?.code)}`;
  if (/invalid_request|bad_?request|validation/i.test(kind) && typeof error?.message === "string") {
    return invalidRequest(clipped(error.message), null, "invalid_request");
  }
  return new ApiError(
    502,
    "The request failed on two origins in the same way, so it was not tried again; check its input.",
    { type: "server_error", code: "origin_error" },
  );
}

/** 500 for an unusable configuration; the message names the bad field (it holds no secrets). */
export function configError(message: string): ApiError {
  return new ApiError(500, message, { type: "server_error", code: "config_error" });
}

/** OpenAI's generic 500; the cause is logged, never sent. */
export function internalError(): ApiError {
  return new ApiError(500, "The server had an error while processing your request.", {
    type: "server_error",
  });
}

const encoder = new TextEncoder();

/**
 * The SSE event that ends a stream whose origin failed after the first byte: OpenAI sends
 * `data: {"error":…}` and no `[DONE]`, which the official SDKs raise as an APIError.
 */
export function errorEvent(error: ApiError): Uint8Array {
  return encoder.encode(`data: ${JSON.stringify(error.toBody())}\n\n`);
}
