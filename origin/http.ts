/**
 * Errors and bodies of the origin's routes: OpenAI's error shape as an exception the app's
 * error handler answers, and JSON bodies read with a clear 400.
 * See origin/PROTOCOL.md.
 */
import type { Context } from "hono";
import type { z } from "zod";
import {
  type ErrorCode,
  type ErrorStatus,
  type ErrorType,
  type OpenAIErrorBody,
  openAIErrorBody,
} from "../contracts/errors.ts";

/** An error answered in OpenAI's shape. */
export class OriginError extends Error {
  override name = "OriginError";
  readonly status: ErrorStatus;
  readonly type: ErrorType;
  readonly code: ErrorCode | null;
  readonly param: string | null;
  constructor(
    status: ErrorStatus,
    message: string,
    code: ErrorCode | null,
    param: string | null = null,
  ) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
    this.type =
      status === 401
        ? "authentication_error"
        : status === 429
          ? "rate_limit_error"
          : status >= 500
            ? "server_error"
            : "invalid_request_error";
  }

  /** Its OpenAI error body. */
  toBody(): OpenAIErrorBody {
    return openAIErrorBody(this.message, this.type, this.code, this.param);
  }
}

export function zodMessage(error: z.ZodError): { message: string; param: string | null } {
  const issue = error.issues[0];
  if (issue === undefined) return { message: "Invalid request body.", param: null };
  const path = issue.path.map(String).join(".");
  return { message: path ? `${path}: ${issue.message}` : issue.message, param: path || null };
}

export async function readJson(c: Context): Promise<unknown> {
  const text = await c.req.text();
  try {
    return JSON.parse(text);
  } catch {
    throw new OriginError(400, "The request body is not valid JSON.", "invalid_json");
  }
}
