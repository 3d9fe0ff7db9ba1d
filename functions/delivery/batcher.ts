/**
 * Attempts through the region's `Batcher` (docs/batching.md): one `answer` RPC for an
 * answer its client gets whole, or `open` and `end` for a streamed one, whose body the
 * Batcher streams to the client itself. Where batching is off, or where the Batcher has
 * just had nothing to batch and this isolate has nothing else in flight there
 * (`idle_bypass_ms`), an attempt goes straight to the candidate origin instead.
 */
import type { Batcher } from "../../durable-objects/batcher/index.ts";
import {
  type BatcherAnswerResult,
  type BatcherAttempt,
  type BatcherCancelOptions,
  type BatcherOpenResult,
  type AttemptRoute,
  type ShardCountNote,
  failureTrailerOf,
} from "../../durable-objects/batcher/types.ts";
import { type ItemTrailer, ItemTrailerSchema } from "../../contracts/protocol/schema.ts";
import {
  type Frame,
  FrameType,
  encodeJsonPayload,
  parsePayload,
} from "../../contracts/protocol/framing.ts";
import { describe } from "../../contracts/upstream.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import { type BatchingPlan, batchingPlan } from "../../contracts/config/plans.ts";
import { batcherName, laneFor, shardRoute } from "./batcher-plan.ts";
import type { AttemptRequest, DispatchAttempt, ItemOpener } from "./opener.ts";
import { frameItem, memoryFrames } from "./item.ts";
import { failed, failedBeforeHead, notAdmitted } from "./refusals.ts";
import { END_WAIT_MS } from "./generated.ts";
import { endOf, pipedItem } from "./batcher-piped.ts";
import type { BatcherMemo } from "./batcher-memo.ts";

/** What the batcher route needs beyond each attempt's request. */
export interface BatcherRoute {
  namespace: DurableObjectNamespace<Batcher>;
  config: ResolvedConfig;
  model: string;
  /** The caller's key tier, when authentication knows it. */
  tier: string | undefined;
  /** The request's `x-warmgate-priority` header. */
  priority: string | undefined;
  /** The caller's key id (for `shard_by: "key"`). */
  keyId: string | undefined;
  /** The request's prefix for the router, per model (null where routing is off). */
  route: (model: string) => AttemptRoute | null;
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

/**
 * An opener that sends each attempt through its region's batcher, or straight to the
 * candidate origin where batching is off, or where the batcher has just had nothing to
 * batch and this isolate has nothing else in flight there (see `idle_bypass_ms`): a lone
 * request then skips the batcher call, the one cost batching would add at low load.
 */
export function batcherOpener(
  route: BatcherRoute,
  memo: BatcherMemo,
  openDirect: ItemOpener,
): ItemOpener {
  const { sentAtOnce, firstByteMs } = memo;
  return async (candidate, request) => {
    const plan = batchingPlan(route.config, candidate.region, route.model);
    if (plan === null || !plan.enabled) return openDirect(candidate, request);
    const quiet = `${candidate.region.id}:${route.model}:${plan.setup.version}`;
    if (bypasses(plan, sentAtOnce.get(quiet), route, request)) {
      const attempt = await openDirect(candidate, request);
      if (attempt.kind !== "open") sentAtOnce.delete(quiet);
      return attempt;
    }
    const started = Date.now();
    const attempt = await submitToBatcher(route, plan, candidate.region.id, request, {
      recentFirstByteMs: firstByteMs.get(quiet) ?? null,
      holdingSetup: memo.holdingSetup,
      shards: memo,
    });
    if (attempt.atOnce) sentAtOnce.set(quiet, Date.now());
    else sentAtOnce.delete(quiet);
    if (attempt.attempt.kind === "open") {
      // An answer that came whole says when its HEAD came; the rest was the answer's body.
      const waited = attempt.waitedMs ?? Date.now() - started;
      memo.heardFirstByte(quiet, attempt.attempt.item.head, waited);
    }
    // The Batcher told the breakers how its call went.
    return { ...attempt.attempt, reported: plan.setup.breakers.enabled };
  };
}

function bypasses(
  plan: BatchingPlan,
  last: number | undefined,
  route: BatcherRoute,
  request: AttemptRequest,
): boolean {
  // A routed request goes through its Batcher, whose router picks the origin.
  if (plan.idleBypassMs <= 0 || request.avoidOrigins.length > 0) return false;
  if (plan.setup.routing !== null) return false;
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
  seen: { recentFirstByteMs: number | null; holdingSetup: Set<string>; shards?: BatcherMemo } = {
    recentFirstByteMs: null,
    holdingSetup: new Set(),
  },
): Promise<{ attempt: DispatchAttempt; atOnce: boolean; waitedMs?: number }> {
  const prefix = plan.setup.routing === null ? null : route.route(route.model);
  const { index, shard, heard } = shardRoute(plan, region, route, request, prefix, seen.shards);
  const name = batcherName(region, route.model, index, plan);
  const stub = route.namespace.getByName(name);
  // The settings go along until the Batcher is known to hold them: they are most of a
  // call's bytes, copied on both sides of every call.
  const holds = seen.holdingSetup.has(name);
  const input: BatcherAttempt = {
    ...(!holds && { setup: plan.setup }),
    id: request.attemptId,
    path: request.path,
    body: request.body,
    headers: request.headers,
    lane: laneFor(plan, route.tier, route.priority),
    promptTokens: route.promptTokens,
    maxTokens: route.maxTokens,
    deadline: route.deadline,
    firstByteTimeoutMs: request.firstByteTimeoutMs,
    itemTimeoutMs: request.itemTimeoutMs,
    avoidOrigins: [...request.avoidOrigins],
    // Always sent (null before a first figure): the batcher then counts this edge's
    // waits by its reports only.
    recentFirstByteMs: seen.recentFirstByteMs,
    ...(prefix !== null && { route: prefix }),
    ...(shard !== undefined && { shard }),
  };
  const id = request.attemptId;
  // Cancels the item, kept alive past the response; resolves with whether it applied.
  const ask = (options?: BatcherCancelOptions): Promise<boolean> => {
    const asking = stub.cancel(id, options).catch(() => false);
    route.waitUntil(asking);
    return asking;
  };
  const tell = (options?: BatcherCancelOptions) => void ask(options);
  const attempt = async (sent: BatcherAttempt) => {
    // A streamed answer's body comes on a stream of its own, which becomes the client's
    // response body as it is: the runtime moves the bytes and this isolate runs nothing per
    // token. Its HEAD answers `open`, and its END the `end` call made right behind it.
    if (request.delivery === "stream") return openAtBatcher(stub, sent, tell, route.signal, heard);
    try {
      return await answerAtBatcher(stub, sent, ask, route, heard);
    } catch (error) {
      return batcherFailed(error);
    }
  };
  const first = await attempt(input);
  if (first !== SETUP_NEEDED) {
    seen.holdingSetup.add(name);
    return first;
  }
  // A new incarnation of the Batcher: the same call again, with its settings.
  seen.holdingSetup.delete(name);
  const again = await attempt({ ...input, setup: plan.setup });
  if (again === SETUP_NEEDED) return batcherFailed(new Error("settings not taken"));
  seen.holdingSetup.add(name);
  return again;
}

// What an attempt answers when its Batcher held no settings and none were sent.
const SETUP_NEEDED = "setup_needed";

/**
 * An attempt whose client gets its answer whole (JSON): `answer` brings its HEAD, body and
 * END in one answer, which become an open item read from memory. Its RPC fails (rejects)
 * only when the batcher itself failed.
 */
async function answerAtBatcher(
  stub: DurableObjectStub<Batcher>,
  input: BatcherAttempt,
  ask: (options: BatcherCancelOptions) => Promise<boolean>,
  route: BatcherRoute,
  heard: (note: ShardCountNote) => void,
): Promise<{ attempt: DispatchAttempt; atOnce: boolean; waitedMs?: number } | typeof SETUP_NEEDED> {
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
        givenUp = setTimeout(() => void ask(timedOut), END_WAIT_MS);
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
    case "setup_needed":
      return SETUP_NEEDED;
    case "refused":
    case "failed":
      return { attempt: notAdmitted(result), atOnce: false };
    case "answered":
      heard(result);
      break;
    default:
      return assertNever(result);
  }
  const { head, body, atOnce } = result;
  const { trailer } = result;
  if (head === null) {
    if (trailer !== null) {
      return { attempt: failedBeforeHead(failureTrailerOf(input.id, trailer)), atOnce };
    }
    // Closed before any HEAD: cancelled while it waited, or lost by the batcher.
    return {
      attempt: failed("unavailable", "batcher: the item ended before its HEAD", null, true),
      atOnce,
    };
  }
  // Cut at the request's timeout: a timeout, whatever the origin said of the cancel, with
  // the usage it reported (what was generated is billed, as for any cancel).
  const received = trailer === null ? null : parsePayload(ItemTrailerSchema, trailer);
  const ended = timedOutRunning ? timedOutTrailer(input.id, received) : received;
  const frames: Frame[] = [];
  if (body.byteLength > 0) frames.push({ type: FrameType.DATA, item: 0, payload: body });
  // An END that is not a trailer is left out: the item then ends broken, as without one.
  const payload = ended === received ? trailer : ended && encodeJsonPayload(ended);
  if (ended !== null && payload !== null)
    frames.push({ type: FrameType.END, item: 0, payload, trailer: ended });
  // Read from memory: the item has ended, and there is nothing to stop on its origin.
  const item = frameItem(head, memoryFrames(frames), { cancel: () => {} });
  return {
    attempt: { kind: "open", item, originId: head.origin },
    atOnce,
    ...(result.headMs === null ? {} : { waitedMs: result.headMs }),
  };
}

/** The END of an item cut at its request's timeout: a timeout unless it had ended well. */
function timedOutTrailer(id: string, ended: ItemTrailer | null): ItemTrailer {
  if (ended?.outcome === "ok") return ended;
  return {
    id,
    outcome: "timeout",
    usage: ended?.usage ?? null,
    error: { message: "The request timed out.", type: "server_error", code: "timeout" },
  };
}

/** A streamed attempt: `open` answers at the item's HEAD, `end` at its END. */
async function openAtBatcher(
  stub: DurableObjectStub<Batcher>,
  input: BatcherAttempt,
  tell: (options?: BatcherCancelOptions) => void,
  signal: AbortSignal | undefined,
  heard: (note: ShardCountNote) => void,
): Promise<{ attempt: DispatchAttempt; atOnce: boolean } | typeof SETUP_NEEDED> {
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
    case "setup_needed":
      return SETUP_NEEDED;
    case "refused":
    case "failed":
      return { attempt: notAdmitted(result), atOnce: false };
    case "ended":
      heard(result);
      return { attempt: failedBeforeHead(result.trailer), atOnce: result.atOnce };
    case "cancelled":
      return {
        attempt: failed("unavailable", "batcher: item cancelled", null, true),
        atOnce: false,
      };
    case "open":
      heard(result);
      break;
    default:
      return assertNever(result);
  }
  const firstByteAt = ending.then(
    (end) => end.firstByteAt,
    () => null,
  );
  const item = pipedItem(result.head, result.body, endOf(ending), firstByteAt, tell);
  return { attempt: { kind: "open", item, originId: result.head.origin }, atOnce: result.atOnce };
}

/**
 * The batcher itself failed (restarted, overloaded): another region's may not. It may have
 * sent the item before (its next incarnation cancels what it left running).
 */
function batcherFailed(error: unknown): { attempt: DispatchAttempt; atOnce: boolean } {
  return {
    attempt: failed("unavailable", `batcher: ${describe(error)}`, null, true),
    atOnce: false,
  };
}

function assertNever(value: never): never {
  throw new Error(`unhandled case ${JSON.stringify(value)}`);
}
