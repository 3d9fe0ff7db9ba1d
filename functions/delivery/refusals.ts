/**
 * What the Batcher's refusals and failures mean to the edge (docs/batching.md, "Callers"):
 * a full lane or a queue timeout is answered with its lane's status (503 by default, or 429)
 * and `retry-after`; a call its origin refused busy is that origin's busy HEAD;
 * every other failure is an attempt that another region's origins may still serve.
 */
import { ApiError, type OriginFailureKind } from "../../contracts/errors.ts";
import { retryAfterMs as askedToWait } from "../../contracts/origin-health.ts";
import type {
  BatcherFailureCode,
  BatcherFailureTrailer,
  BatcherNotAdmitted,
} from "../../durable-objects/batcher/types.ts";
import { retryAfterHeaders, retryAfterSeconds } from "../accounts/rate-limit-headers.ts";
import { busyItem } from "./item.ts";
import type { DispatchAttempt } from "./opener.ts";

/** A refusal or failure at admission, before the item was queued. */
export function notAdmitted(result: BatcherNotAdmitted): DispatchAttempt {
  if (result.kind === "refused") {
    return { kind: "refused", error: queueFull(result.status, result.retryAfterMs) };
  }
  const failure = result.code === "duplicate_id" ? "bad_answer" : failureOf(result.code);
  return failed(failure, result.detail, null);
}

/** An item that ended before its origin answered, from its lone END's trailer. */
export function failedBeforeHead(trailer: BatcherFailureTrailer): DispatchAttempt {
  const { code, message } = trailer.error;
  if (code === "queue_timeout") {
    return {
      kind: "refused",
      error: queueTimeout(trailer.status ?? 503, trailer.retry_after_ms ?? 1_000),
    };
  }
  // Its origin refused the call busy: said as that origin's HEAD would say it (judged busy).
  if (trailer.busy === true && trailer.origin !== undefined) {
    const { id, status = 503, retry_after_ms: ms = 1_000 } = trailer;
    const headers = { ...retryAfterHeaders(ms), "content-type": "application/json" };
    const body = new TextEncoder().encode(JSON.stringify({ error: trailer.error }));
    const item = busyItem(id, status, headers, body);
    return { kind: "open", item, originId: trailer.origin };
  }
  // Named, the origin was sent the item (and stopped on it when the Batcher gave it up).
  const origin = trailer.origin ?? null;
  return failed(failureOf(code), message, origin, origin !== null, trailer.unreachable === true);
}

/**
 * A failed attempt; `mayHaveRun` when the item may have reached an origin (`originId`, or
 * one of its region's when that is null); `unreachable` when its call could not reach it.
 */
export function failed(
  failure: OriginFailureKind,
  detail: string,
  originId: string | null,
  mayHaveRun = false,
  unreachable = false,
): DispatchAttempt {
  return {
    kind: "failed",
    failure,
    detail,
    originId,
    ...(mayHaveRun && { mayHaveRun }),
    ...(unreachable && { unreachable: true as const }),
  };
}

const FAILURES: Record<Exclude<BatcherFailureCode, "queue_timeout">, OriginFailureKind> = {
  no_healthy_origin: "unavailable",
  origin_unavailable: "unavailable",
  origin_error: "bad_answer",
  origin_timeout: "timeout",
  // No origin of this region can hold it; another region's may.
  prompt_too_large: "unavailable",
};

function failureOf(code: BatcherFailureCode): OriginFailureKind {
  return code === "queue_timeout" ? "timeout" : FAILURES[code];
}

/** A full lane: every origin is busy and the lane holds all it may; retry after `retry-after`. */
export function queueFull(status: 429 | 503, retryAfterMs: number): ApiError {
  const seconds = retryAfterSeconds(retryAfterMs);
  return new ApiError(
    status,
    `The server is receiving more requests for this model than it can queue. Please try again in ${seconds}s.`,
    {
      type: status === 429 ? "rate_limit_error" : "server_error",
      code: "queue_full",
      headers: retryAfterHeaders(retryAfterMs),
    },
  );
}

/** A lane's queue timeout: 503 (overloaded) or 429 (retry later), with `retry-after`. */
export function queueTimeout(status: 429 | 503, retryAfterMs: number): ApiError {
  return new ApiError(
    status,
    "The request waited too long for capacity on this model. Please try again later.",
    {
      type: status === 429 ? "rate_limit_error" : "server_error",
      code: "queue_timeout",
      headers: retryAfterHeaders(retryAfterMs),
    },
  );
}

/**
 * 503 `no_healthy_origin` for a request whose last origin was busy (its origins are well,
 * only full), with its retry-after.
 */
export function busyEverywhere(headers: Record<string, string>): ApiError {
  const waitMs = askedToWait(headers);
  return new ApiError(
    503,
    `The origins tried for this request are busy. Please try again in ${retryAfterSeconds(waitMs)}s.`,
    { type: "server_error", code: "no_healthy_origin", headers: retryAfterHeaders(waitMs) },
  );
}

/**
 * A request's final failure, answered like a served one with how many origins were tried
 * for it (`x-warmgate-attempts`, docs/api.md); a refusal before any attempt says nothing.
 */
export function withAttempts(error: unknown, attempts: readonly unknown[] | undefined): unknown {
  const tried = attempts?.length ?? 0;
  if (!(error instanceof ApiError) || tried === 0) return error;
  return error.withHeaders({ "x-warmgate-attempts": String(tried) });
}
