/**
 * The one OpenAI error shape, `{"error":{message,type,param,code}}`, for the edge and the
 * origin alike (`openAIErrorBody`), the catalogue of every `code` warmgate itself answers
 * with, and the typed errors of the edge's request path: handlers throw {@link ApiError};
 * only `app.onError`, `notFound` and a stream's mid-flight error event turn it into a
 * body. Runtime-neutral. See docs/edge.md, "Errors".
 */

/** OpenAI's error `type` values that warmgate produces. */
export type ErrorType =
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

/**
 * Every `error.code` warmgate's own answers and item trailers carry, edge and origin, with
 * what it means; an engine's own codes pass through untouched and are not listed.
 */
export const ERROR_CODES = {
  // The edge: a request body field, in OpenAI's vocabulary (`param` names the field).
  invalid_type: "a field of the wrong type",
  invalid_value: "a field with a value it may not have",
  missing_required_parameter: "a required field is missing",
  unsupported_parameter: "a field this gateway does not support",
  empty_array: "an array that may not be empty is",
  array_below_min_length: "an array shorter than its minimum",
  array_above_max_length: "an array longer than its maximum",
  object_above_max_size: "an object with more keys than its maximum",
  string_too_short: "a string shorter than its minimum",
  string_above_max_length: "a string longer than its maximum",
  integer_below_min_value: "an integer below its minimum",
  integer_above_max_value: "an integer above its maximum",
  decimal_below_min_value: "a number below its minimum",
  decimal_above_max_value: "a number above its maximum",
  json_above_max_depth: "JSON nested deeper than the limit",
  unsupported_content_type: "a body that is not `application/json`",
  invalid_date: "a date parameter that is not a date",
  // The edge: the request, its key and its limits.
  invalid_api_key: "the key or browser token is missing, malformed, unknown, revoked or expired",
  key_revoked: "a revoked key cannot be rotated, blocked or unblocked",
  key_blocked: "the key is blocked by its operator until unblocked",
  invalid_region: "an unknown region in `x-warmgate-region`",
  invalid_origin: "an unknown origin in `x-warmgate-origin`",
  region_override_not_allowed: "the key may not choose a region",
  origin_override_not_allowed: "the key may not choose an origin",
  origin_not_allowed: "the request's Origin is not allowed for this key",
  model_not_allowed: "the key may not use the model",
  rate_limit_exceeded: "a requests, tokens or concurrency limit of the key, its team or end user",
  insufficient_quota: "the credit or budget of the key or its team cannot cover the request",
  team_not_empty: "a team that still has keys cannot be deleted",
  permission_denied: "the credential may not use this route",
  request_too_large: "the body is over the configured limit",
  context_length_exceeded: "prompt and completion exceed the model's window",
  invalid_request: "the engine refused the input on two origins alike",
  config_error: "the gateway's configuration is unusable",
  endpoint_not_offered: "counting input tokens (`/v1/responses/input_tokens`) is not offered",
  // The edge: things looked up by name (see `notFound`).
  model_not_found: "no such model is served",
  key_not_found: "no API key with that id",
  team_not_found: "no team with that id",
  batcher_not_found: "no Batcher serves that model in that region",
  origin_not_found: "no origin with that id is configured",
  canary_not_found: "no canary is configured for that model",
  request_not_found: "no request with that id for this key",
  response_not_found: "no stored response: the gateway keeps none",
  file_not_found: "no file with that id for this key",
  batch_not_found: "no batch with that id for this key",
  // The edge: the Batch API (docs/batch-api.md).
  invalid_file: "a batch input file that is not JSON Lines of valid batch requests",
  file_too_large: "a batch input file over 200 MB",
  batch_not_cancellable: "the batch has already ended or is ending",
  // The edge and the Batcher: origins.
  no_healthy_origin: "no origin may serve the model right now (503, `retry-after`)",
  origin_error: "the origin failed or answered something unusable",
  origin_timeout: "the origin did not answer in time",
  origin_unavailable: "the origin could not be reached or cannot take work",
  queue_full: "every origin is busy and the lane holds all it may (`retry-after`)",
  queue_timeout: "the request waited past its lane's queue timeout (`retry-after`)",
  prompt_too_large: "no origin's KV cache can ever hold the prompt",
  timeout: "the request's own timeout cut the item",
  // The origin: its batch protocol and routes (origin/PROTOCOL.md).
  invalid_json: "the body is not JSON, or an item's body is not a JSON object",
  invalid_batch: "the batch envelope is not valid",
  batch_too_large: "more items than the origin accepts",
  duplicate_item_id: "two items of a batch share an id",
  batch_conflict: "a batch with that id is still running",
  invalid_cancel: "the cancel request is not valid",
  invalid_outcomes_request: "the outcomes request is not valid",
  invalid_fault_config: "the fault configuration is not valid",
  invalid_access_token: "the origin's access token is missing or wrong",
  invalid_admin_token: "the origin's admin token is missing or wrong",
  not_found: "the origin has no such route",
  too_many_connections: "the origin has all the connections it serves open (503, `retry-after`)",
  internal_error: "the origin failed to handle the request",
  // The origin: how an item ended (END's `error.code`, or a synthetic HEAD's body).
  engine_error: "the engine threw",
  engine_unreachable: "the engine could not be reached",
  engine_stream_truncated: "the engine's stream ended before its end",
  origin_stream_dropped: "an injected fault dropped the stream",
  origin_fault_injected: "an injected fault answered the item",
  item_timeout: "the item's `timeout_ms` passed",
  item_cancelled: "the item was cancelled",
  item_aborted: "the item was aborted before the engine answered",
  response_failed: "the engine's Responses API stream failed",
} as const;
/** A `code` of {@link ERROR_CODES}. */
export type ErrorCode = keyof typeof ERROR_CODES;

/** Whether `code` is in the catalogue. */
export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(ERROR_CODES, code);
}

/** The body of every error answer, exactly OpenAI's shape. */
export interface OpenAIErrorBody {
  error: { message: string; type: ErrorType; param: string | null; code: ErrorCode | null };
}

/** OpenAI's error body: the one place it is built, for the edge and the origin. */
export function openAIErrorBody(
  message: string,
  type: ErrorType,
  code: ErrorCode | null,
  param: string | null = null,
): OpenAIErrorBody {
  return { error: { message, type, param, code } };
}

const ERROR_STATUSES = [
  400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418,
  421, 422, 423, 424, 425, 426, 428, 429, 431, 451, 500, 501, 502, 503, 504, 505, 506, 507, 508,
  510, 511,
] as const;
/** An HTTP status an error answer may carry: RFC 9110's client and server errors. */
export type ErrorStatus = (typeof ERROR_STATUSES)[number];

/** Whether `status` is an {@link ErrorStatus}. */
export function isErrorStatus(status: number): status is ErrorStatus {
  return (ERROR_STATUSES as readonly number[]).includes(status);
}

/** Options of an {@link ApiError}. */
export interface ApiErrorOptions {
  type: ErrorType;
  param?: string | null;
  code?: ErrorCode | null;
  /** Extra response headers (`allow`, `retry-after`, …). */
  headers?: Record<string, string>;
}

/** An error the client is meant to see, with OpenAI's status, type, param and code. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly status: ErrorStatus;
  readonly type: ErrorType;
  readonly param: string | null;
  readonly code: ErrorCode | null;
  readonly headers: Record<string, string>;

  constructor(status: ErrorStatus, message: string, options: ApiErrorOptions) {
    super(message);
    this.status = status;
    this.type = options.type;
    this.param = options.param ?? null;
    this.code = options.code ?? null;
    this.headers = options.headers ?? {};
  }

  /** The same error, answered with `extra` headers besides its own. */
  withHeaders(extra: Record<string, string>): ApiError {
    const { type, param, code } = this;
    return new ApiError(this.status, this.message, {
      type,
      param,
      code,
      headers: { ...this.headers, ...extra },
    });
  }

  /** The OpenAI error body for this error. */
  toBody(): OpenAIErrorBody {
    return openAIErrorBody(this.message, this.type, this.code, this.param);
  }
}

/** 400 for a bad request field; `param` is OpenAI's path, e.g. `messages[0].role`. */
export function invalidRequest(message: string, param: string | null, code: ErrorCode | null) {
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
  return invalidApiKey(
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
  );
}

/**
 * 401 `invalid_api_key` for a credential that is refused (unknown, revoked, expired); unlike
 * OpenAI the message never quotes the credential, so it never reaches logs.
 */
export function invalidApiKey(message = "Incorrect API key provided."): ApiError {
  return new ApiError(401, message, { type: "invalid_request_error", code: "invalid_api_key" });
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

/** A code of {@link ERROR_CODES} that names the kind of thing that was not found. */
export type NotFoundCode = Extract<ErrorCode, `${string}_not_found`>;

/** 404 for a thing looked up by name (a model, a key, an origin…) that is not there. */
export function notFound(
  message: string,
  code: NotFoundCode,
  param: string | null = null,
): ApiError {
  return new ApiError(404, message, { type: "invalid_request_error", param, code });
}

/** 404 with OpenAI's wording for a model that is not served. */
export function modelNotFound(model: string): ApiError {
  return notFound(
    `The model \`${clipped(model)}\` does not exist or you do not have access to it.`,
    "model_not_found",
    "model",
  );
}

/** 404 for an OpenAI endpoint this gateway knows and does not offer, saying what serves instead. */
export function notOffered(message: string): ApiError {
  return new ApiError(404, message, {
    type: "invalid_request_error",
    code: "endpoint_not_offered",
  });
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
} as const satisfies Record<OriginFailureKind, readonly [ErrorStatus, string, ErrorCode]>;

/**
 * 502/503/504 for origins that failed before the first byte reached the client; a 503
 * always says when to come back (`retry-after`, 1 s unless the caller sets a later time).
 */
export function originFailure(kind: OriginFailureKind): ApiError {
  const [status, message, code] = ORIGIN_FAILURES[kind];
  return new ApiError(status, message, {
    type: "server_error",
    code,
    ...(kind === "unavailable" && { headers: { "retry-after": "1", "retry-after-ms": "1000" } }),
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
