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
import { sleep } from "../contracts/sleep.ts";

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

/** The Node response behind a request, when @hono/node-server serves it. */
interface Outgoing {
  destroy(): void;
  socket?: { writableLength?: number } | null;
}

/** The Node response behind a request, when @hono/node-server serves it. */
export function outgoingOf(c: Context): Outgoing | null {
  const env: unknown = c.env;
  if (typeof env !== "object" || env === null || !("outgoing" in env)) return null;
  const outgoing: unknown = env.outgoing;
  return typeof outgoing === "object" &&
    outgoing !== null &&
    "destroy" in outgoing &&
    typeof outgoing.destroy === "function"
    ? (outgoing as Outgoing)
    : null;
}

/** How long a broken answer's bytes get to reach its reader before the connection breaks. */
const BREAK_GRACE_MS = 100;

/**
 * Breaks a streamed answer's connection without ending its body, so that its reader takes it
 * as cut, not whole: once `handedOver` says the body's bytes went to the connection and the
 * connection sent them (at most a second), and a grace for the reader to take them.
 */
export async function breakConnection(c: Context, handedOver: () => boolean): Promise<void> {
  const outgoing = outgoingOf(c);
  const sent = () => handedOver() && (outgoing?.socket?.writableLength ?? 0) === 0;
  for (let waited = 0; waited < 1_000 && !sent(); waited += 5) {
    await sleep(5);
  }
  await sleep(BREAK_GRACE_MS);
  outgoing?.destroy();
}
