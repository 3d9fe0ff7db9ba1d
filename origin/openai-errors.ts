/**
 * Errors of the OpenAI-compatible forwarder (docs/configuration.md, "The origin"): what a
 * failed fetch says, an engine error body as OpenAI's error object, and the JSON error
 * answers the origin writes itself.
 */
import { type ErrorCode, type ErrorType, openAIErrorBody } from "../contracts/errors.ts";
import type { EngineOutcome, EngineResponse } from "./engine.ts";
import { objectOrNull } from "./sse-usage.ts";

const encoder = new TextEncoder();

/** What a failed fetch says, as briefly as the cause allows. */
export function describeFetchError(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause;
    if (typeof cause === "object" && cause !== null && "code" in cause) return String(cause.code);
    // undici wraps the socket error ("fetch failed"); the cause says what really happened.
    if (cause instanceof Error && cause.message !== "") return cause.message;
    return error.message;
  }
  return String(error);
}

/** An error answer of the origin itself, in OpenAI's shape. */
export function jsonError(
  status: number,
  message: string,
  type: ErrorType,
  code: ErrorCode,
): EngineResponse {
  const text = JSON.stringify(openAIErrorBody(message, type, code));
  return {
    status,
    headers: { "content-type": "application/json" },
    body: (async function* () {
      yield encoder.encode(text);
    })(),
    outcome: Promise.resolve({
      outcome: status === 499 ? "cancelled" : "error",
      usage: null,
      error: { message, type, code },
      queued_ms: 0,
      ttft_ms: null,
    }),
  };
}

/** An engine's error body as OpenAI's error object. */
export function errorOf(text: string, status: number): NonNullable<EngineOutcome["error"]> {
  const body = objectOrNull(text);
  const error = body?.error;
  if (typeof error === "object" && error !== null) {
    const e = error as { message?: unknown; type?: unknown; code?: unknown };
    return {
      message: typeof e.message === "string" ? e.message : `engine answered ${status}`,
      type: typeof e.type === "string" ? e.type : "server_error",
      code:
        typeof e.code === "string" ? e.code : typeof e.code === "number" ? String(e.code) : null,
    };
  }
  // vLLM and FastAPI also answer {"detail": …} or {"message": …} for some errors.
  const message =
    typeof body?.message === "string"
      ? body.message
      : typeof body?.detail === "string"
        ? body.detail
        : `engine answered ${status}`;
  return { message, type: status >= 500 ? "server_error" : "invalid_request_error", code: null };
}

/** The error of a Responses API `response.failed` event, as the item's error. */
export function responseError(
  event: Record<string, unknown> | null,
): NonNullable<EngineOutcome["error"]> {
  const response = event?.response as { error?: { message?: unknown; code?: unknown } } | undefined;
  const error = response?.error;
  return {
    message: typeof error?.message === "string" ? error.message : "The engine's response failed.",
    type: "server_error",
    code: typeof error?.code === "string" ? error.code : "response_failed",
  };
}
