/**
 * The edge's side of the `Batcher` Durable Object: which batcher a request goes to
 * (region, model, shard and settings version), its priority lane, and one `submit` RPC
 * per attempt whose frame stream becomes the same {@link OpenItem} the direct path gives
 * `dispatch.ts`. With `batching.enabled: false` for a region or model, attempts go
 * straight to the candidate origin instead.
 */
import type { Batcher } from "../durable-objects/batcher/index.ts";
import type {
  BatcherAnswerResult,
  BatcherCancelOptions,
  BatcherFailureCode,
  BatcherFailureTrailer,
  BatcherNotAdmitted,
  BatcherOpenResult,
  BatcherSetup,
  BatcherSubmit,
} from "../durable-objects/batcher/types.ts";
import { DEFAULT_CLIENT_BACKLOG_BYTES } from "../durable-objects/batcher/types.ts";
import { type WindowConfigInput, WindowConfigSchema } from "../durable-objects/batcher/settings.ts";
import {
  type Frame,
  type ItemTrailer,
  decodeJsonPayload,
  encodeJsonPayload,
  FrameType,
} from "../contracts/protocol.ts";
import {
  type BatchingConfig,
  type GatewayConfig,
  type RegionConfig,
  originServes,
} from "./config.ts";
import {
  type AttemptRequest,
  CANCEL_USAGE_WAIT_MS,
  type DispatchAttempt,
  type ItemOpener,
  openDirect,
} from "./dispatch.ts";
import { ApiError, type OriginFailureKind } from "../contracts/errors.ts";
import { type FrameReader, describe } from "../contracts/upstream.ts";
import { openItemFromFrames } from "./origin-client.ts";
import { retryAfterHeaders } from "./rate-limit-headers.ts";

/** Request header that moves a request to a lower-priority lane (never a higher one). */
export const PRIORITY_HEADER = "x-warmgate-priority";

/** Lane of each key tier when the lanes are the default three (interactive, standard, background). */
export const TIER_LANES: Readonly<Record<string, number>> = { high: 0, standard: 1, low: 2 };

/** How long an origin whose call failed is skipped unless configured otherwise. */
export const DEFAULT_ORIGIN_QUARANTINE_MS = 2_000;

/** See `batching.idle_bypass_ms`. */
export const DEFAULT_IDLE_BYPASS_MS = 1_000;

const DEFAULT_LANE = 1;

/** Where and how one region's requests for one model are batched. */
export interface BatchingPlan {
  /** False: the unbatched path, one call per request straight to the origin. */
  enabled: boolean;
  setup: BatcherSetup;
  shards: number;
  shardBy: "request" | "key";
  /** Lane of a caller with no tier, clamped to the lanes there are. */
  defaultLane: number;
  /** See `batching.idle_bypass_ms`; 0 never bypasses the batcher. */
  idleBypassMs: number;
}

type BatchingSettings = Omit<BatchingConfig, "overrides">;

const plans = new WeakMap<GatewayConfig, Map<string, BatchingPlan | null>>();

/**
 * The batching plan for a region and model (null when no origin of the region serves it).
 * Global settings first, then each matching override in order; cached per config.
 */
export function batchingPlan(
  config: GatewayConfig,
  region: RegionConfig,
  model: string,
): BatchingPlan | null {
  let byTarget = plans.get(config);
  if (byTarget === undefined) {
    byTarget = new Map();
    plans.set(config, byTarget);
  }
  const key = `${region.id}\u0000${model}`;
  const cached = byTarget.get(key);
  if (cached !== undefined) return cached;
  const plan = buildPlan(config.batching, region, model);
  byTarget.set(key, plan);
  return plan;
}

function buildPlan(
  batching: BatchingConfig,
  region: RegionConfig,
  model: string,
): BatchingPlan | null {
  const origins = region.origins.filter((origin) => originServes(origin, model));
  if (origins.length === 0) return null;
  const { overrides, ...base } = batching;
  let settings: BatchingSettings = base;
  for (const { region: r, model: m, ...override } of overrides) {
    if ((r === undefined || r === region.id) && (m === undefined || m === model)) {
      settings = { ...settings, ...definedOnly(override) };
    }
  }
  const input: WindowConfigInput = {
    maxBatchSize: settings.max_batch_size,
    maxBatchTokens: settings.max_batch_tokens,
    maxWindowMs: settings.max_window_ms,
    callIntervalMs: settings.call_interval_ms,
    waitShare: settings.wait_share,
    holdShare: settings.hold_share,
    maxHoldMs: settings.max_hold_ms,
    rateWindowMs: settings.rate_window_ms,
    loadReportTtlMs: settings.load_report_ttl_ms,
    lanes: settings.lanes?.map((lane) => ({
      queueTimeoutMs: lane.queue_timeout_ms,
      onTimeout: lane.on_timeout,
      maxQueue: lane.max_queue,
      timeoutStatus: lane.timeout_status,
    })),
    origins: origins.map((origin) => ({ id: origin.id })),
  };
  const window = WindowConfigSchema.parse(input);
  const quarantineMs = settings.origin_quarantine_ms ?? DEFAULT_ORIGIN_QUARANTINE_MS;
  const clientBacklogBytes = settings.max_client_backlog_bytes ?? DEFAULT_CLIENT_BACKLOG_BYTES;
  const urls = origins.map((origin) => ({ id: origin.id, url: origin.url }));
  return {
    enabled: settings.enabled ?? true,
    setup: {
      version: fnv1a(JSON.stringify({ window, urls, quarantineMs, clientBacklogBytes })),
      window,
      origins: urls,
      quarantineMs,
      clientBacklogBytes,
    },
    shards: settings.shards ?? 1,
    shardBy: settings.shard_by ?? "request",
    defaultLane: Math.min(settings.default_lane ?? DEFAULT_LANE, window.lanes.length - 1),
    idleBypassMs: settings.idle_bypass_ms ?? DEFAULT_IDLE_BYPASS_MS,
  };
}

function definedOnly<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * The lane of a request: its key tier's (or the default), moved down by the priority
 * header when that names a lower lane (`high`, `standard`, `low`, or a lane number).
 */
export function laneFor(
  plan: BatchingPlan,
  tier: string | undefined,
  header: string | undefined,
): number {
  const last = plan.setup.window.lanes.length - 1;
  const tierLane = tier === undefined ? undefined : TIER_LANES[tier];
  const base = Math.min(tierLane ?? plan.defaultLane, last);
  const asked = parsePriority(header);
  // Only lower: a caller may give up priority, never take more than its key has.
  return asked === null ? base : Math.min(Math.max(base, asked), last);
}

function parsePriority(header: string | undefined): number | null {
  if (header === undefined) return null;
  const value = header.trim().toLowerCase();
  const tierLane = TIER_LANES[value];
  if (tierLane !== undefined) return tierLane;
  return /^\d{1,2}$/.test(value) ? Number(value) : null;
}

/** Name of the batcher for a region, model and shard: `region:model:shard:version`. */
export function batcherName(
  region: string,
  model: string,
  shard: number,
  plan: BatchingPlan,
): string {
  return `${region}:${model}:${shard}:${plan.setup.version}`;
}

/** The shard of a request: a hash of its request id or its key id, per `shard_by`. */
export function shardOf(plan: BatchingPlan, requestId: string, keyId: string | undefined): number {
  if (plan.shards === 1) return 0;
  const basis = plan.shardBy === "key" && keyId !== undefined ? keyId : requestId;
  return Number.parseInt(fnv1a(basis), 16) % plan.shards;
}

/** What the batcher route needs beyond each attempt's request. */
export interface BatcherRoute {
  namespace: DurableObjectNamespace<Batcher>;
  config: GatewayConfig;
  model: string;
  /** The caller's key tier, when authentication knows it. */
  tier: string | undefined;
  /** The request's `x-warmgate-priority` header. */
  priority: string | undefined;
  /** The caller's key id (for `shard_by: "key"`). */
  keyId: string | undefined;
  promptTokens: number;
  /** Completion tokens the request may produce (its worst case when unbounded). */
  maxTokens: number;
  /** Absolute ms after which the client no longer wants an answer. */
  deadline: number;
  /** Requests this isolate has in flight to these origins (this one included, once begun). */
  isolateInFlight: (originIds: readonly string[]) => number;
  /** Keeps the request alive for work that outlives the response (an item's cancel). */
  waitUntil: (promise: Promise<unknown>) => void;
  /**
   * Aborts when the client disconnects (Workers' `request.signal`, with the
   * `enable_request_signal` compatibility flag): a request still waiting in a lane leaves it.
   */
  signal?: AbortSignal;
}

// Per isolate: when each region's batcher (by name without shard) last sent one of this
// isolate's requests at once. A cache: losing it only costs a batcher call.
const sentAtOnce = new Map<string, number>();
// Per isolate and batcher: a moving average of how long requests waited for their HEAD
// from the start of their dispatch, which the batcher's window weighs (see `wait_share`).
const firstByteMs = new Map<string, number>();
const FIRST_BYTE_SMOOTHING = 0.2;

/**
 * An opener that sends each attempt through its region's batcher, or straight to the
 * candidate origin where batching is off, or where the batcher has just had nothing to
 * batch and this isolate has nothing else in flight there (see `idle_bypass_ms`): a lone
 * request then skips the batcher call, the one cost batching would add at low load.
 */
export function batcherOpener(route: BatcherRoute): ItemOpener {
  return async (candidate, request) => {
    const plan = batchingPlan(route.config, candidate.region, route.model);
    if (plan === null || !plan.enabled) return openDirect(candidate, request);
    const quiet = `${candidate.region.id}:${route.model}:${plan.setup.version}`;
    if (bypasses(plan, quiet, route, request)) {
      const attempt = await openDirect(candidate, request);
      if (attempt.kind !== "open") sentAtOnce.delete(quiet);
      return attempt;
    }
    const started = Date.now();
    const attempt = await submitToBatcher(route, plan, candidate.region.id, request, {
      recentFirstByteMs: firstByteMs.get(quiet) ?? null,
    });
    if (attempt.atOnce) sentAtOnce.set(quiet, Date.now());
    else sentAtOnce.delete(quiet);
    if (attempt.attempt.kind === "open") {
      // An answer that came whole says when its HEAD came; the rest was the answer's body.
      const waited = attempt.waitedMs ?? Date.now() - started;
      const previous = firstByteMs.get(quiet);
      firstByteMs.set(
        quiet,
        previous === undefined ? waited : previous + FIRST_BYTE_SMOOTHING * (waited - previous),
      );
    }
    return attempt.attempt;
  };
}

function bypasses(
  plan: BatchingPlan,
  quiet: string,
  route: BatcherRoute,
  request: AttemptRequest,
): boolean {
  if (plan.idleBypassMs <= 0 || request.avoidOrigins.length > 0) return false;
  const last = sentAtOnce.get(quiet);
  if (last === undefined || Date.now() - last >= plan.idleBypassMs) return false;
  // This request is counted once it began: more than one means company.
  return route.isolateInFlight(plan.setup.origins.map((origin) => origin.id)) <= 1;
}

/**
 * One attempt through the batcher of `region`, as an {@link OpenItem}: `open` for a streamed
 * answer, `answer` for one its client gets whole. `atOnce`: the batcher sent it at once, with nothing to batch
 * it with; `waitedMs`, when known, how long its HEAD took from admission.
 */
export async function submitToBatcher(
  route: BatcherRoute,
  plan: BatchingPlan,
  region: string,
  request: AttemptRequest,
  seen: { recentFirstByteMs: number | null } = { recentFirstByteMs: null },
): Promise<{ attempt: DispatchAttempt; atOnce: boolean; waitedMs?: number }> {
  const shard = shardOf(plan, request.requestId, route.keyId);
  const stub = route.namespace.getByName(batcherName(region, route.model, shard, plan));
  const input: BatcherSubmit = {
    setup: plan.setup,
    id: request.attemptId,
    path: request.path,
    body: request.body,
    headers: request.headers,
    lane: laneFor(plan, route.tier, route.priority),
    promptTokens: route.promptTokens,
    maxTokens: route.maxTokens,
    deadline: route.deadline,
    firstByteTimeoutMs: request.firstByteTimeoutMs,
    timeHead: request.timeHead,
    itemTimeoutMs: request.itemTimeoutMs,
    avoidOrigins: [...request.avoidOrigins],
    // Always sent (null before a first figure): the batcher then counts this edge's
    // waits by its reports only.
    recentFirstByteMs: seen.recentFirstByteMs,
  };
  const id = request.attemptId;
  // Cancels the item, kept alive past the response; resolves with whether it applied.
  const ask = (options?: BatcherCancelOptions): Promise<boolean> => {
    const asking = stub.cancel(id, options).catch(() => false);
    route.waitUntil(asking);
    return asking;
  };
  const tell = (options?: BatcherCancelOptions) => void ask(options);
  // A streamed answer's body comes on a stream of its own, which becomes the client's
  // response body as it is: the runtime moves the bytes and this isolate runs nothing per
  // token. Its HEAD answers `open`, and its END the `end` call made right behind it.
  if (request.timeHead) return openAtBatcher(stub, input, tell, route.signal);
  try {
    return await answerAtBatcher(stub, input, ask, route);
  } catch (error) {
    return batcherFailed(error);
  }
}

/**
 * An attempt whose client gets its answer whole (JSON): `answer` brings its HEAD, body and
 * END in one answer, which become an open item read from memory. Its RPC fails (rejects)
 * only when the batcher itself failed.
 */
async function answerAtBatcher(
  stub: DurableObjectStub<Batcher>,
  input: BatcherSubmit,
  ask: (options: BatcherCancelOptions) => Promise<boolean>,
  route: BatcherRoute,
): Promise<{ attempt: DispatchAttempt; atOnce: boolean; waitedMs?: number }> {
  // Waiting ends early when its client goes away or its time runs out (once). A
  // running item is cancelled on its origin, and its END still brings the usage generated
  // until then; should no END come (a call that hangs), the item is let go of. At the
  // timeout, an item still waiting in its lane stays there, as a streamed one would: the
  // lane's timeout decides.
  let stopped = false;
  // Whether the batcher cancelled the item at the timeout (not if it was still queued).
  let timedOutRunning = false;
  let answered = false;
  let givenUp: ReturnType<typeof setTimeout> | undefined;
  const stop = (why: "client" | "timeout") => {
    if (stopped) return;
    stopped = true;
    const timedOut = why === "timeout" ? { timedOut: true } : {};
    void ask({ untilEnd: true, ...timedOut }).then((cancelling) => {
      if (cancelling && why === "timeout") timedOutRunning = true;
      if (cancelling && !answered) {
        givenUp = setTimeout(() => void ask(timedOut), CANCEL_USAGE_WAIT_MS);
      }
    });
  };
  const gone = () => stop("client");
  route.signal?.addEventListener("abort", gone, { once: true });
  const deadline = setTimeout(() => stop("timeout"), Math.max(0, route.deadline - Date.now()));
  let result: BatcherAnswerResult;
  try {
    result = await stub.answer(input);
  } finally {
    answered = true;
    route.signal?.removeEventListener("abort", gone);
    clearTimeout(deadline);
    if (givenUp !== undefined) clearTimeout(givenUp);
  }
  switch (result.kind) {
    case "refused":
    case "failed":
      return { attempt: notAdmitted(result), atOnce: false };
    case "answered":
      break;
    default:
      return assertNever(result);
  }
  const { head, body, atOnce } = result;
  let { trailer } = result;
  if (head === null) {
    if (trailer !== null) {
      return {
        attempt: failedBeforeHead(decodeJsonPayload(trailer) as BatcherFailureTrailer),
        atOnce,
      };
    }
    // Closed before any HEAD: cancelled while it waited, or lost by the batcher.
    return {
      attempt: failed("unavailable", "batcher: the item ended before its HEAD", null),
      atOnce,
    };
  }
  if (timedOutRunning) trailer = timedOutTrailer(input.id, trailer);
  const frames: Frame[] = [];
  if (body.byteLength > 0) frames.push({ type: FrameType.DATA, item: 0, payload: body });
  if (trailer !== null) frames.push({ type: FrameType.END, item: 0, payload: trailer });
  const item = openItemFromFrames(
    head,
    memoryFrames(frames),
    () => {},
    undefined,
    async () => {},
  );
  return {
    attempt: { kind: "open", item, originId: head.origin },
    atOnce,
    ...(result.headMs === null ? {} : { waitedMs: result.headMs }),
  };
}

/**
 * The END of an item cut at its request's timeout: a timeout, whatever the origin said of
 * the cancel, with the usage it reported (none when no END came).
 */
function timedOutTrailer(id: string, trailer: Uint8Array | null): Uint8Array {
  const ended = trailer === null ? null : (decodeJsonPayload(trailer) as ItemTrailer);
  if (ended?.outcome === "ok") return trailer as Uint8Array;
  const timedOut: ItemTrailer = {
    id,
    outcome: "timeout",
    usage: ended?.usage ?? null,
    error: { message: "The request timed out.", type: "server_error", code: "timeout" },
  };
  return encodeJsonPayload(timedOut);
}

/** A {@link FrameReader} over frames already in memory. */
function memoryFrames(frames: readonly Frame[]): FrameReader {
  let at = 0;
  return {
    async next() {
      return frames[at++] ?? "the item ended without an END";
    },
    takeReadyData: () => undefined,
    cancel() {
      at = frames.length;
    },
  };
}

/** A streamed attempt: `open` answers at the item's HEAD, `end` at its END. */
async function openAtBatcher(
  stub: DurableObjectStub<Batcher>,
  input: BatcherSubmit,
  tell: (options?: BatcherCancelOptions) => void,
  signal: AbortSignal | undefined,
): Promise<{ attempt: DispatchAttempt; atOnce: boolean }> {
  const id = input.id;
  // Waiting in a lane, the item leaves it when its client goes away.
  const gone = () => tell();
  signal?.addEventListener("abort", gone, { once: true });
  let result: BatcherOpenResult;
  const opening = stub.open(input);
  // Right behind `open`, so it arrives after it (see durable-objects/batcher/index.ts); read only once the item
  // opened: a refused or failed one has no END.
  const ending = stub.end(id);
  ending.catch(() => {});
  try {
    result = await opening;
  } catch (error) {
    return batcherFailed(error);
  } finally {
    signal?.removeEventListener("abort", gone);
  }
  switch (result.kind) {
    case "refused":
    case "failed":
      return { attempt: notAdmitted(result), atOnce: false };
    case "ended":
      return { attempt: failedBeforeHead(result.trailer), atOnce: result.atOnce };
    case "cancelled":
      return { attempt: failed("unavailable", "batcher: item cancelled", null), atOnce: false };
    case "open":
      break;
    default:
      return assertNever(result);
  }
  const { head, body } = result;
  const cancel = () => {
    body.cancel().catch(() => {});
    tell();
  };
  const item = openItemFromFrames(head, endReader(ending), cancel, undefined, () =>
    stub.cancel(id, { untilEnd: true }),
  );
  item.piped = {
    body,
    clientGone: () => tell({ untilEnd: true }),
    timeOut: () => tell({ timedOut: true }),
  };
  return { attempt: { kind: "open", item, originId: head.origin }, atOnce: result.atOnce };
}

/** The END that `end` answers, as the one frame left to read of an opened item. */
function endReader(ending: Promise<Uint8Array | null>): FrameReader {
  let read = false;
  return {
    async next() {
      if (read) return "no frames after the END";
      read = true;
      try {
        const trailer = await ending;
        // Null: the item's call was cut after its HEAD, or the batcher lost the item.
        if (trailer === null) return "the item ended without an END";
        return { type: FrameType.END, item: 0, payload: trailer };
      } catch (error) {
        return `batcher: ${describe(error)}`;
      }
    },
    takeReadyData: () => undefined,
    cancel() {
      read = true;
    },
  };
}

/** The batcher itself failed (restarted, overloaded): another region's may not. */
function batcherFailed(error: unknown): { attempt: DispatchAttempt; atOnce: boolean } {
  return { attempt: failed("unavailable", `batcher: ${describe(error)}`, null), atOnce: false };
}

/** A refusal or failure at admission, before the item was queued. */
function notAdmitted(result: BatcherNotAdmitted): DispatchAttempt {
  if (result.kind === "refused") return { kind: "refused", error: queueFull(result.retryAfterMs) };
  const failure = result.code === "duplicate_id" ? "bad_answer" : failureOf(result.code);
  return failed(failure, result.detail, null);
}

/** An item that ended before its origin answered, from its lone END's trailer. */
function failedBeforeHead(trailer: BatcherFailureTrailer): DispatchAttempt {
  const { code, message } = trailer.error;
  if (code === "queue_timeout") {
    return {
      kind: "refused",
      error: queueTimeout(trailer.status ?? 503, trailer.retry_after_ms ?? 1_000),
    };
  }
  return failed(failureOf(code), message, trailer.origin ?? null);
}

function failed(
  failure: OriginFailureKind,
  detail: string,
  originId: string | null,
): DispatchAttempt {
  return { kind: "failed", failure, detail, originId };
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

/** 429 for a full lane: the client should come back after `retry-after`. */
export function queueFull(retryAfterMs: number): ApiError {
  const seconds = Math.max(1, Math.ceil(retryAfterMs / 1_000));
  return new ApiError(
    429,
    `The server is receiving more requests for this model than it can queue. Please try again in ${seconds}s.`,
    {
      type: "rate_limit_error",
      code: "rate_limit_exceeded",
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

/** 32-bit FNV-1a of a string, as 8 hex digits: stable names and shard choice, not security. */
export function fnv1a(text: string): string {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return (hash >>> 0).toString(16).padStart(8, "0");
}

function assertNever(value: never): never {
  throw new Error(`unhandled case ${JSON.stringify(value)}`);
}
