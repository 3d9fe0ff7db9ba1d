/**
 * The one failover loop of the edge (docs/edge.md, "Delivery"): each attempt goes
 * through an {@link ItemOpener}, straight to the candidate origin as a batch of one
 * ({@link openDirect}) or through the region's `Batcher` (`batcher.ts`), which both answer
 * with an `OpenItem` (`item.ts`). Before the first byte reaches the client a failing origin is
 * replaced by the next candidate, within the retry budget, and origins that failed are
 * avoided; the answer is then delivered by `response.ts`.
 */
import { logWarn } from "../../contracts/log.ts";
import type { Limits } from "../../contracts/config/limits.ts";
import type { RegionConfig } from "../../contracts/config/regions.ts";
import {
  type ApiError,
  type OriginFailureKind,
  failedEverywhere,
  originFailure,
} from "../../contracts/errors.ts";
import type { Verdict } from "../../contracts/breaker.ts";
import { judgeHead, retryAfterMs } from "../../contracts/origin-health.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { OriginPool, RegionOrigin } from "./origin-pool.ts";
import type { SettledRequest } from "../accounts/settlement.ts";
import { credentialValues } from "../../contracts/credentials.ts";
import type { RequestAttempt } from "../../durable-objects/key-account/types.ts";
import { type ItemAttempt, openItem } from "./direct.ts";
import { type GivenUp, cancelGivenUp } from "./generated.ts";
import { readWhole, respond, streams } from "./response.ts";
import { RETRY_WINDOW_MS, type RetryBudget } from "./retry-budget.ts";

/** How the client gets its answer: streamed as it comes, or whole once it ended. */
export type DeliveryMode = "stream" | "whole";

/** One attempt at serving the request, as an opener receives it. */
export interface AttemptRequest {
  requestId: string;
  /** Item id for this attempt: the request id, suffixed for retries (unique per attempt). */
  attemptId: string;
  path: ItemPath;
  body: string;
  headers: Record<string, string>;
  firstByteTimeoutMs: number;
  /** How the client gets its answer: streamed as it comes, or whole once it ended. */
  delivery: DeliveryMode;
  itemTimeoutMs: number;
  /** Origins that already failed this request. */
  avoidOrigins: readonly string[];
  /** For an attempt sent straight to an origin: told once it is under way (see `direct.ts`). */
  onStart?: (giveUp: () => void) => void;
  /** For an attempt sent straight to an origin: its HEAD is late while the origin is idle. */
  onSlowHead?: () => void;
  /** How long the origin may send nothing before it counts as frozen. */
  silenceMs?: number;
  /** Where the origins' credentials are (the Worker's secrets). */
  secrets: object;
}

/** An attempt's outcome: an open item, a failure worth another candidate, or a final refusal. */
export type DispatchAttempt =
  | ItemAttempt
  /** Refused for a reason no other origin changes (a full queue): answered as it is. */
  | { kind: "refused"; error: ApiError };

/** Opens the request's item for one candidate; never rejects. */
export type ItemOpener = (
  candidate: RegionOrigin,
  request: AttemptRequest,
) => Promise<DispatchAttempt>;

/** The unbatched path: the candidate origin, a batch of one. */
export const openDirect: ItemOpener = (candidate, request) =>
  openItem(candidate.origin, {
    requestId: request.attemptId,
    credentials: credentialValues(request.secrets, candidate.origin.credentials),
    path: request.path,
    body: request.body,
    headers: request.headers,
    firstByteTimeoutMs: request.firstByteTimeoutMs,
    // Engines send a streamed answer's HEAD at once, a whole one's when it is complete.
    timeHead: request.delivery === "stream",
    itemTimeoutMs: request.itemTimeoutMs,
    readWhole: request.delivery === "whole",
    ...(request.onStart !== undefined && { onStart: request.onStart }),
    ...(request.onSlowHead !== undefined && { onSlowHead: request.onSlowHead }),
    ...(request.silenceMs !== undefined && { silenceMs: request.silenceMs }),
  });

/** What the edge sends and how it reports the end. */
export interface DispatchOptions {
  requestId: string;
  path: ItemPath;
  /** The client's body text (with only the model alias replaced), forwarded as is. */
  body: string;
  /** The resolved model id. */
  model: string;
  /** Origins in the order to try them. */
  candidates: readonly RegionOrigin[];
  pool: OriginPool;
  limits: Limits;
  /** How the client gets its answer (the plan's decision). */
  delivery: DeliveryMode;
  /** Lower-case headers forwarded to the engine. */
  headers: Record<string, string>;
  /** Where the origins' credentials are (the Worker's secrets). */
  secrets: object;
  /** Called exactly once when the request ends, however it ends. */
  onSettled: (settled: Omit<SettledRequest, "requestId">) => void;
  /**
   * Called at once, before `onSettled`, when a streamed answer's client went away while
   * what its origin generated is not known yet: its slot and reservation come back now.
   */
  onReleased?: (released: Omit<SettledRequest, "requestId">) => void;
  /** How each attempt reaches an origin (default {@link openDirect}). */
  open?: ItemOpener;
  /**
   * Told how each attempt at an origin went, for the breakers (docs/failover.md, "What
   * counts"); not of what a Batcher judged itself.
   */
  onOutcome?: (region: RegionConfig, origin: string, verdict: Verdict) => void;
  /** An origin silent this long (of this thread's on-time) is frozen. */
  slowFirstByteMs?: number;
  /**
   * How long an origin of `region` that failed is tried only after every healthy one: its
   * region and model's `origin_quarantine_ms`, overrides applied, as its Batchers have it
   * (undefined: the health rule's own).
   */
  quarantineMs?: (region: RegionConfig) => number | undefined;
  /** Calls `giveUp` should the origin's breaker open; answers how to stop watching. */
  watchBreaker?: (origin: string, giveUp: () => void) => () => void;
  /** An attempt through a Batcher failed: the region's breakers may have changed. */
  onUpstreamFailure?: (region: RegionConfig) => void;
  /** Where each attempt is listed, for the request's usage record. */
  attempts?: RequestAttempt[];
  /** The isolate's retry budget; without one, retries are bounded by `retry_budget` alone. */
  retryBudget?: RetryBudget;
  /** Origins no attempt may go to (a canary's pool, for its baseline requests). */
  avoidAlways?: readonly string[];
  /** Origins the first attempt may not go to (the baseline, for a canary request). */
  avoidFirst?: readonly string[];
  /**
   * Aborts when the client disconnects (Workers' `request.signal`): how the edge learns it
   * for a body the upstream streams itself (the Batcher's).
   */
  signal?: AbortSignal;
  /**
   * Where attempts given up on after reaching an origin are listed: should the request end
   * unserved, it is billed for what they generated (see `generated.ts`).
   */
  gaveUp?: GivenUp[];
  /** How long a stream whose client went away waits for its END (default `END_WAIT_MS`). */
  endWaitMs?: number;
  now?: () => number;
}

/**
 * Tries candidates until one answers; returns the client's response, or throws the
 * {@link ApiError} (502/503/504, or an opener's refusal) of the last failure when none did.
 * Each attempt is judged once by the rule of `contracts/origin-health.ts` (docs/failover.md).
 * Before a refusal, the attempts it gave up on are cancelled on their origins (listed in
 * `gaveUp`, so that the request is billed for what they generated: docs/key-account.md).
 */
export async function dispatchCompletion(options: DispatchOptions): Promise<Response> {
  const gaveUp: GivenUp[] = [];
  try {
    return await tryCandidates(options, gaveUp);
  } catch (error) {
    await cancelGivenUp(gaveUp, options.secrets);
    throw error;
  } finally {
    options.gaveUp?.push(...gaveUp);
  }
}

async function tryCandidates(options: DispatchOptions, gaveUp: GivenUp[]): Promise<Response> {
  const now = options.now ?? Date.now;
  const open = options.open ?? openDirect;
  const attempts = Math.min(options.candidates.length, options.limits.retryBudget + 1);
  const avoid: string[] = [];
  const firstAttempt = options.attempts?.length ?? 0;
  // The request timeout bounds every attempt together.
  const deadline = now() + options.limits.requestTimeoutMs;
  const { retryRatio: ratio, retryFloor: floor } = options.limits;
  options.retryBudget?.request(now());
  let failure: OriginFailureKind = "unavailable";
  // An origin whose engine answered 5xx waits for a second opinion: another origin that
  // answers the same request convicts it; one that fails it too convicts the request.
  let suspect: { candidate: RegionOrigin; originId: string } | null = null;
  const judge = (candidate: RegionOrigin, origin: string, verdict: Verdict) =>
    options.onOutcome?.(candidate.region, origin, verdict);
  const convictSuspect = () => {
    if (suspect !== null) judge(suspect.candidate, suspect.originId, "failed");
    suspect = null;
  };
  try {
    for (let i = 0; i < attempts; i++) {
      // A client that went away while an attempt waited wants no other origin tried.
      if (i > 0 && options.signal?.aborted === true) break;
      if (i > 0 && now() >= deadline) {
        failure = "timeout";
        break;
      }
      const budget = { ratio, floor, windowMs: RETRY_WINDOW_MS };
      if (i > 0 && options.retryBudget !== undefined && !options.retryBudget.retry(now(), budget)) {
        logWarn("retry budget spent", { request_id: options.requestId });
        break;
      }
      const candidate = options.candidates[i] as RegionOrigin;
      const quarantineMs = options.quarantineMs?.(candidate.region);
      const planned = candidate.origin.id;
      const last = i === attempts - 1;
      options.pool.begin(planned);
      let unwatch: (() => void) | null = null;
      // Judged slow while it waited: that was its verdict.
      let toldSlow = false;
      // Unique across the request's models too (a model fallback dispatches again).
      const n = firstAttempt + i;
      const itemId = n === 0 ? options.requestId : `${options.requestId}.${n}`;
      const attempt = await open(candidate, {
        requestId: options.requestId,
        attemptId: itemId,
        path: options.path,
        body: options.body,
        headers: options.headers,
        firstByteTimeoutMs: options.limits.firstByteTimeoutMs,
        delivery: options.delivery,
        itemTimeoutMs: options.limits.requestTimeoutMs,
        avoidOrigins: [
          ...avoid,
          ...options.pool.blocked(candidate.region),
          ...(options.avoidAlways ?? []),
          ...(i === 0 ? (options.avoidFirst ?? []) : []),
        ],
        secrets: options.secrets,
        onStart: (giveUp) => {
          unwatch = options.watchBreaker?.(planned, giveUp) ?? null;
        },
        onSlowHead: () => {
          toldSlow = true;
          judge(candidate, planned, "slow");
        },
        ...(options.slowFirstByteMs !== undefined && { silenceMs: options.slowFirstByteMs }),
      });
      (unwatch as (() => void) | null)?.();
      options.pool.end(planned);
      if (attempt.kind === "refused") throw attempt.error;
      const listed: RequestAttempt = {
        region: candidate.region.id,
        origin: attempt.originId,
        result: "failed",
      };
      options.attempts?.push(listed);
      if (attempt.kind === "failed") {
        if (attempt.reported === true) options.onUpstreamFailure?.(candidate.region);
        // Refused or unreachable, an origin ran nothing; it may have, once it took the call
        // (an origin not named, only when its opener says so).
        const named = attempt.originId !== null && attempt.failure !== "unavailable";
        if (named || attempt.mayHaveRun === true) {
          gaveUp.push(...givenUp(options, attempt.originId, itemId, candidate.region.id));
        }
        if (attempt.originId !== null) {
          // A Batcher judged its own call; an attempt sent straight is judged here.
          if (attempt.reported !== true && !toldSlow) {
            judge(candidate, attempt.originId, attempt.soft === true ? "slow" : "failed");
          }
          options.pool.reportFailure(attempt.originId, now(), quarantineMs);
          avoid.push(attempt.originId);
        }
        failure = attempt.failure;
        logWarn("origin attempt failed", {
          request_id: options.requestId,
          origin: attempt.originId,
          detail: attempt.detail,
        });
        continue;
      }
      const originId = attempt.originId;
      const { status, headers } = attempt.item.head;
      const judged = judgeHead(status, headers);
      if (judged === "busy") {
        // Overload, never counted: avoided until its retry-after. A last 429 goes to the
        // client as it is (the SDKs back off by it); a last 503 becomes our own 503
        // `no_healthy_origin`, with the origin's retry-after.
        options.pool.reportBusy(originId, now(), headers);
        if (!last || status === 503) attempt.item.cancel();
        if (!last) {
          avoid.push(originId);
          failure = "unavailable";
          continue;
        }
        if (status === 503) throw busyEverywhere(headers);
      }
      if (judged === "error") {
        avoid.push(originId);
        // Tried last for a while, whoever is to blame (a ranking, not a verdict).
        options.pool.reportFailure(originId, now(), quarantineMs);
        // The origin's own item timeout answers 504 (see origin/server.ts).
        failure = status === 504 ? "timeout" : "bad_answer";
        logWarn("origin answered", { status, request_id: options.requestId, origin: originId });
        if (suspect !== null) {
          // Two origins failed it alike: the request's fault, and no origin's.
          suspect = null;
          const text = await attempt.item
            .whole()
            .then(({ body }) => new TextDecoder().decode(body))
            .catch(() => "");
          throw failedEverywhere(text);
        }
        attempt.item.cancel();
        suspect = { candidate, originId };
        continue;
      }
      // Another origin answered: the one that failed this request before was sick.
      if (judged === "ok") convictSuspect();
      // An answer is judged once it ended, whole or cut after its HEAD (by either path).
      const onEnd = (verdict: "ok" | "failed") => {
        if (!toldSlow && judged === "ok") judge(candidate, originId, verdict);
      };
      const served = { region: candidate.region.id, origin: originId };
      if (streams(attempt.item, options)) {
        listed.result = "served";
        options.pool.reportSuccess(originId);
        options.pool.begin(originId);
        return respond(attempt.item, served, options, null, deadline, gaveUp, onEnd);
      }
      // A whole answer is read before the client sees anything: one its origin cut or failed
      // is tried again elsewhere, and never billed (its client received none of it).
      const read = await readWhole(attempt.item, deadline - now());
      const cut = !read.complete && !read.timedOut && status < 400;
      if (!read.timedOut) onEnd(cut ? "failed" : "ok");
      const retry = cut && !last && now() < deadline && options.signal?.aborted !== true;
      if (retry) {
        gaveUp.push(...givenUp(options, originId, itemId, candidate.region.id));
        avoid.push(originId);
        options.pool.reportFailure(originId, now(), quarantineMs);
        failure = "bad_answer";
        logWarn("origin failed mid-response", { request_id: options.requestId, origin: originId });
        continue;
      }
      listed.result = "served";
      options.pool.reportSuccess(originId);
      options.pool.begin(originId);
      return respond(attempt.item, served, options, read, deadline, gaveUp);
    }
  } finally {
    // No second opinion came (one candidate, or the retries ran out): the 5xx counts.
    convictSuspect();
  }
  const error: ApiError = originFailure(options.candidates.length === 0 ? "unavailable" : failure);
  throw error;
}

/**
 * Attempt `itemId`, given up on at origin `originId` (none for an origin not configured), or
 * at any origin of region `region` when which one is not known (a Batcher's item).
 */
function givenUp(
  options: DispatchOptions,
  originId: string | null,
  itemId: string,
  region: string,
): GivenUp[] {
  const at = options.candidates.filter((candidate) =>
    originId === null ? candidate.region.id === region : candidate.origin.id === originId,
  );
  return at.slice(0, originId === null ? at.length : 1).map((candidate) => ({
    region: candidate.region.id,
    origin: candidate.origin,
    itemId,
  }));
}

/** 503 `no_healthy_origin` for a request whose last origin was busy, with its retry-after. */
function busyEverywhere(headers: Record<string, string>): ApiError {
  const error = originFailure("unavailable");
  error.headers["retry-after"] = String(Math.max(1, Math.ceil(retryAfterMs(headers) / 1_000)));
  return error;
}
