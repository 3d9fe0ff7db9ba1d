/**
 * `app.onError` and `app.notFound`: the only places (with the validator) where an error
 * becomes OpenAI's `{"error":{message,type,param,code}}` body. Never a stack, never HTML.
 * See docs/edge.md.
 */
import { logError } from "../contracts/log.ts";
import type { Context, ErrorHandler, NotFoundHandler } from "hono";
import { HTTPException } from "hono/http-exception";
import type { AppEnv } from "./app-env.ts";
import {
  ApiError,
  internalError,
  invalidMethod,
  invalidUrl,
  isErrorStatus,
} from "../contracts/errors.ts";

function toApiError(error: unknown, c: Context<AppEnv>): ApiError {
  if (error instanceof ApiError) return error;
  if (error instanceof HTTPException && error.status < 500 && isErrorStatus(error.status)) {
    // Raised by Hono middleware (e.g. a malformed request); its message is meant for clients.
    if (error.status === 405) return invalidMethod(c.req.method, c.req.path, []);
    return new ApiError(error.status, error.message || "Invalid request.", {
      type: "invalid_request_error",
    });
  }
  logError("unhandled error", { request_id: c.get("requestId"), error });
  return internalError();
}

/** Renders any thrown error as an OpenAI error response. */
export const handleError: ErrorHandler<AppEnv> = (error, c) => {
  const apiError = toApiError(error, c);
  return c.json(apiError.toBody(), apiError.status, apiError.headers);
};

/** OpenAI's 404 for unknown routes: `Invalid URL (GET /v1/nope)`. */
export const handleNotFound: NotFoundHandler<AppEnv> = (c) => {
  const apiError = invalidUrl(c.req.method, c.req.path);
  return c.json(apiError.toBody(), apiError.status);
};

/** A handler that answers a known path's other methods with 405 and `allow`. */
export function methodNotAllowed(allow: readonly string[]) {
  return function rejectMethod(c: Context): never {
    throw invalidMethod(c.req.method, c.req.path, allow);
  };
}
