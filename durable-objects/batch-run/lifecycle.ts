/**
 * The pure core of a batch (docs/batch-api.md, "Lifecycle"): which step its alarm takes,
 * given its status, its lines' counts and the time, and the OpenAI batch object of its
 * state. No I/O; time comes in as `now` (ms).
 */
import type { BatchStop } from "../key-account/batch-types.ts";
import type { BatchStatus, OpenAIBatch } from "./types.ts";

/** A batch as stored (times in ms, null until reached). */
export interface BatchState {
  id: string;
  endpoint: string;
  inputFileId: string;
  metadata: Record<string, string> | null;
  status: BatchStatus;
  createdAt: number;
  inProgressAt: number | null;
  expiresAt: number;
  finalizingAt: number | null;
  completedAt: number | null;
  failedAt: number | null;
  expiredAt: number | null;
  cancellingAt: number | null;
  cancelledAt: number | null;
  outputFileId: string | null;
  errorFileId: string | null;
  /** Set when the key's account stopped the batch (revoked, expired, blocked, model gone). */
  stoppedFor?: BatchStop;
}

/** How many lines are in each state. */
export interface LineCounts {
  total: number;
  pending: number;
  running: number;
  ok: number;
  failed: number;
}

/** How a batch that stopped taking lines ends. */
export type BatchEnding = "completed" | "expired" | "cancelled";

/** What the alarm does next. */
export type BatchStep =
  /** Start pending lines while the lane has room. */
  | { kind: "run" }
  /** Start nothing more: pending lines fail with `code`, running ones are waited for. */
  | { kind: "drain"; ending: BatchEnding; code: DrainCode; message: string }
  /** Every line ended: write the output and error files, then take the final status. */
  | { kind: "finalize"; ending: BatchEnding }
  /** Nothing left to do. */
  | { kind: "done" };

/** The final status a finalizing batch takes. */
function endingOf(state: BatchState, now: number): BatchEnding {
  if (state.cancellingAt !== null) return "cancelled";
  return state.expiredAt !== null || now >= state.expiresAt ? "expired" : "completed";
}

/** The next step of a batch's alarm. */
export function stepOf(state: BatchState, counts: LineCounts, now: number): BatchStep {
  switch (state.status) {
    case "validating":
    case "in_progress":
    case "cancelling": {
      const ending = endingOf(state, now);
      if (ending === "completed") {
        return counts.pending + counts.running === 0
          ? { kind: "finalize", ending }
          : { kind: "run" };
      }
      if (counts.pending + counts.running === 0) return { kind: "finalize", ending };
      return drain(ending, state.stoppedFor);
    }
    case "finalizing":
      return { kind: "finalize", ending: endingOf(state, now) };
    case "completed":
    case "failed":
    case "expired":
    case "cancelled":
      return { kind: "done" };
    default: {
      const unknown: never = state.status;
      throw new Error(`unknown batch status ${String(unknown)}`);
    }
  }
}

/** Why a line of a draining batch was not run. */
type DrainCode = "batch_expired" | "batch_cancelled" | BatchStop;

const NOT_RUN: Record<DrainCode, string> = {
  batch_expired: "This request could not be executed before the completion window expired.",
  batch_cancelled: "This request was not executed: the batch was cancelled.",
  key_revoked: "This request was not executed: the batch's API key was revoked.",
  key_expired: "This request was not executed: the batch's API key expired.",
  key_blocked: "This request was not executed: the batch's API key was blocked.",
  model_not_allowed:
    "This request was not executed: the batch's API key may no longer use its model.",
};

function drain(ending: Exclude<BatchEnding, "completed">, stop?: BatchStop): BatchStep {
  const code = ending === "expired" ? "batch_expired" : (stop ?? "batch_cancelled");
  return { kind: "drain", ending, code, message: NOT_RUN[code] };
}

/**
 * The change that stops a batch its key's account no longer lets run (`stop`): it is
 * cancelled as a client's cancel would, its lines not yet sent failing with that reason;
 * null when the account let it go on or it is ending already.
 */
export function stopped(
  state: BatchState,
  stop: BatchStop | null,
  now: number,
): Partial<BatchState> | null {
  if (stop === null || !cancellable(state.status)) return null;
  return { status: "cancelling", cancellingAt: now, stoppedFor: stop };
}

/**
 * How many lines to start now, with `free` of the lane's `inFlight` places open and
 * `pending` lines waiting: lines go in groups of an eighth of the lane (read from the file
 * together, their prefixes together), or whatever is left, or at once when none runs.
 */
export function linesToStart(inFlight: number, free: number, pending: number): number {
  const group = Math.max(1, Math.floor(inFlight / 8));
  const take = Math.min(free, pending);
  return take >= group || take === pending || free === inFlight ? take : 0;
}

/** A charge is sent once this many ended lines wait for one… */
export const CHARGE_LINES = 64;
/** …or this long after the last one (and always before the output files are written). */
export const CHARGE_EVERY_MS = 1_000;

/** Whether to bill the ended lines now: `uncharged` of them, the last charge `sinceMs` ago. */
export function chargeDue(uncharged: number, sinceMs: number): boolean {
  return uncharged >= CHARGE_LINES || (uncharged > 0 && sinceMs >= CHARGE_EVERY_MS);
}

/** Whether a batch in `status` may still be cancelled (OpenAI refuses once it ended). */
export function cancellable(status: BatchStatus): boolean {
  return status === "validating" || status === "in_progress";
}

const seconds = (ms: number | null): number | null => (ms === null ? null : Math.floor(ms / 1000));

/** The OpenAI batch object of a batch. */
export function batchObject(state: BatchState, counts: LineCounts): OpenAIBatch {
  return {
    id: state.id,
    object: "batch",
    endpoint: state.endpoint,
    errors:
      state.stoppedFor === undefined
        ? null
        : {
            object: "list",
            data: [{ code: state.stoppedFor, message: NOT_RUN[state.stoppedFor], line: null }],
          },
    input_file_id: state.inputFileId,
    completion_window: "24h",
    status: state.status,
    output_file_id: state.outputFileId,
    error_file_id: state.errorFileId,
    created_at: Math.floor(state.createdAt / 1000),
    in_progress_at: seconds(state.inProgressAt),
    expires_at: Math.floor(state.expiresAt / 1000),
    finalizing_at: seconds(state.finalizingAt),
    completed_at: seconds(state.completedAt),
    failed_at: seconds(state.failedAt),
    expired_at: seconds(state.expiredAt),
    cancelling_at: seconds(state.cancellingAt),
    cancelled_at: seconds(state.cancelledAt),
    request_counts: { total: counts.total, completed: counts.ok, failed: counts.failed },
    metadata: state.metadata,
  };
}

/** One line's record in the output or error file (OpenAI's batch output line). */
export function outputRecord(
  lineId: string,
  customId: string,
  answer:
    | { kind: "response"; status: number; requestId: string; body: string }
    | { kind: "error"; code: string; message: string },
): string {
  if (answer.kind === "error") {
    return JSON.stringify({
      id: lineId,
      custom_id: customId,
      response: null,
      error: { code: answer.code, message: answer.message },
    });
  }
  // The origin's body as it wrote it when it is JSON; else as a string.
  let body: string;
  try {
    JSON.parse(answer.body);
    body = answer.body;
  } catch {
    body = JSON.stringify(answer.body);
  }
  const head = JSON.stringify({ id: lineId, custom_id: customId }).slice(0, -1);
  return `${head},"response":{"status_code":${answer.status},"request_id":${JSON.stringify(answer.requestId)},"body":${body}},"error":null}`;
}
