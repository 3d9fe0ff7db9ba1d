// Batcher: one Durable Object per region, model and shard. Requests for that region and
// model gather here in priority lanes and leave as batches over the origin batch protocol,
// one upstream call per (flush, origin); each caller gets its own item's frames back.
// The policy (window, lanes, KV-aware admission, origin choice) is the pure core in
// `window.ts`; this class only keeps its state, runs the timers, talks to origins and
// moves bytes.
//
// Naming: `region:model:shard:version`, where `version` is a hash of the batching settings
// and the origins (see `functions/batcher-client.ts`), so a configuration change starts
// fresh instances while the old ones finish what they hold.
//
// The RPC surface: `answer`, `open` and `submit` (one call per request attempt), `end` (the
// END of an opened item), `cancel` (an item whose client went away), `snapshot` (counters
// and the window's view, for operators and tests).
//
// `answer` is for an answer its client gets whole (JSON): it admits or refuses at once, and
// answers an admitted item once it ended, with its HEAD, body and END trailer in one answer
// (the HEAD null when none came, the trailer null when the item closed without an END). No
// stream is set up and no frame relayed: under load, a quarter of the edge's CPU for such a
// request.
//
// `submit` admits or refuses at once; an admitted item's answer is a byte stream of that
// item's own frames in the protocol's framing, item index 0: HEAD, DATA…, END as its
// origin sent them (DATA and END payloads byte for byte; HEAD gains an `origin` field
// naming the origin that serves it, see {@link BatcherHead}). The frames one origin chunk
// carries for a caller reach it in one write, at once; nothing is held back for later ones.
// An item that never reached an engine gets one END alone whose trailer says why
// (`error.code` is a {@link BatcherFailureCode}); an item whose origin connection broke after
// its HEAD gets a stream that ends without END. Cancelling the stream (noticed at its next
// write) or calling `cancel` cancels the item: a waiting item leaves the queue, a running
// one is cancelled on its origin.
//
// `open` is for a streamed answer, whose body goes on a stream of its own that the caller
// hands its client as the response body: the runtime carries the bytes to the client
// without the caller running per chunk. `open` answers at the item's HEAD with that stream
// (or with a refusal, or with the trailer of an END that came before any HEAD), and `end`,
// which the caller calls right behind `open`, answers with the item's END trailer (null when
// the call was cut after the HEAD): two RPCs and one stream per request, no frame stream.
// Calls to one stub arrive in the order they were made, so `end` finds the item `open`
// registered; an item whose caller never asks for its END keeps a settled promise until
// this object goes away. Such a body has one write in flight at a time, and bytes that come
// meanwhile join the next write (see `client-body.ts`): under load, fewer and larger
// writes. While this object's thread lags, such an item's tokens after its first engine
// step also wait up to a share of that lag, one timer per call, and leave together (see
// `tokenHoldMs` in `window.ts`); its HEAD, first step and END never wait. For such an
// item this object also writes the OpenAI error event that ends a body whose item failed
// after its HEAD (origin error, timeout, cut call), and a body whose client went away
// cancels the item on its origin but keeps its END coming, whose usage bills what was
// generated. A body is never ended cleanly for an item that did not end well.
//
// Tables
//   schema_migrations  version INTEGER PK, applied_at. One row per applied migration.
//   open_batches       batch_id TEXT PK, origin_id, origin_url, sent_at, item_ids (JSON
//                      array). One row per upstream call that has been running for
//                      {@link OPEN_BATCH_RECORD_DELAY_MS} or more: written behind (see
//                      `write-behind.ts`) once the call has run that long, deleted behind
//                      when its response ends, however it ends. A call that ends sooner never
//                      touches storage: its queued INSERT is simply dropped.
//
// Why the rows are written behind: any SQL write holds every outgoing message of this
// object (the origin call, the frames streamed to callers) until its commit, a synchronous
// fsync under `wrangler dev` that blocks the whole thread, and a batcher that wrote twice
// per call spent more time committing than moving bytes. The rows only matter for calls
// that outlive a restart of this object, and the origin already cancels every unfinished
// item of a call whose connection drops (PROTOCOL.md, Cancellation), which is what a
// restart does to the calls it interrupts; the rows are the backstop for a drop the origin
// never notices. A crash within the delay of a call's start forgets that call's row, which
// leaves its cancellation to the dropped connection alone.
//
// Invariants
//   - The queue, the window state and the callers' streams live in memory only: they
//     describe live callers, and an eviction ends every caller's stream (or pending RPC)
//     with an error, so after a restart there is nobody to resume. What must survive is
//     which calls the origins may still be running: every `open_batches` row not written by
//     this incarnation is an orphan, which the alarm cancels on its origin and deletes
//     (cancelling a batch that already ended is harmless by protocol). Reads of the table
//     flush the queued writes first.
//   - Every admitted item ends exactly once for its caller: HEAD…END, an END alone, or a
//     stream that ends without END; never two answers.
//   - Per origin, an item stays in the core's in-flight list until its END frame, until its
//     call failed, or until its call ended without one, so slots and KV room are never
//     leaked by a caller that went away.
//   - The alarm is set only while a batch is open, something is queued, or orphans wait;
//     running it twice changes nothing.

import { AnswerSink, type CallerSink, FrameStreamSink, WholeSink } from "./caller-sink.ts";
import { ClientBody } from "./client-body.ts";
import { applyMigrations } from "../migrations.ts";
import { errorEvent, originFailure } from "../../contracts/errors.ts";
import { WriteBehind } from "../write-behind.ts";
import { DurableObject } from "cloudflare:workers";
import {
  ALARM_BACKSTOP_MS,
  BODY_BUFFER_BYTES,
  type BatchRecord,
  type BatcherAnswerResult,
  type BatcherCancelOptions,
  type BatcherCounters,
  type BatcherFailureCode,
  type BatcherFailureTrailer,
  type BatcherHead,
  type BatcherNotAdmitted,
  type BatcherOpenResult,
  type BatcherSetup,
  type BatcherSnapshot,
  type BatcherSubmit,
  type BatcherSubmitResult,
  CALLER_BUFFER_BYTES,
  OPEN_BATCH_RECORD_DELAY_MS,
  READ_TURN_MS,
  RECENT_BATCHES,
} from "./types.ts";

import {
  cancelBatchItems,
  batchAnswerProblem,
  describe,
  postBatch,
  type UpstreamOrigin,
} from "../../contracts/upstream.ts";
import {
  BATCH_PROTOCOL_VERSION,
  type BatchRequest,
  type Frame,
  FrameDecoder,
  FrameType,
  type ItemHead,
  type ItemTrailer,
  type LoadReport,
  decodeJsonPayload,
  encodeJsonPayload,
} from "../../contracts/protocol.ts";
import { chooseLeastLoadedInTurn } from "./origin-choice.ts";
import {
  type Batch,
  type WindowOptions,
  type WindowState,
  cancel as cancelInWindow,
  createWindowState,
  currentWindowMs,
  enqueue,
  healthyCandidates,
  markOriginDown,
  meanThreadLagMs,
  onDispatched,
  onItemDone,
  onOriginLoad,
  queuedCount,
  recordFirstByteWait,
  recordThreadLag,
  tokenHoldMs,
  tick,
} from "./window.ts";
import { WindowConfigSchema } from "./settings.ts";

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE open_batches (
     batch_id TEXT PRIMARY KEY, origin_id TEXT NOT NULL, origin_url TEXT NOT NULL,
     sent_at INTEGER NOT NULL, item_ids TEXT NOT NULL);`,
];

type BatchRow = { batch_id: string; origin_id: string; origin_url: string };

/** Where a caller's item is. `ended`: its caller has had its answer (or went away). */
type CallerStage = "queued" | "sent" | "open" | "ended";

interface Caller {
  input: BatcherSubmit;
  stage: CallerStage;
  /** Where its HEAD, DATA and END go: its frame stream, or the answers of `open` and `end`. */
  sink: CallerSink;
  /** The client's response body, when the caller handed it over (see the top of this file). */
  body: ClientBody | null;
  batch: OpenBatch | null;
  headTimer: ReturnType<typeof setTimeout> | null;
  /** The HEAD's status, once it came. */
  status: number | null;
  /** Cancelled on its origin while its stream waits for the END (`cancel` with `untilEnd`). */
  cancelling: boolean;
  /** Its first body byte has come back. */
  firstByte: boolean;
}

interface OpenBatch {
  id: string;
  originId: string;
  url: string;
  /** By item index. */
  callers: Caller[];
  /** Item indexes whose END arrived (or whose accounting was closed). */
  done: Set<number>;
  abort: AbortController;
  /** Why the call was aborted on purpose, if it was. */
  abortReason: "timeout" | "all-cancelled" | null;
  /** Callers whose later tokens wait for {@link OpenBatch.holdTimer} (see `tokenHoldMs`). */
  held: Set<Caller>;
  holdTimer: ReturnType<typeof setTimeout> | null;
}

/** Micro-batching window, lanes and demultiplexing for one region, model and shard. */
export class Batcher extends DurableObject<Env> {
  #setup: BatcherSetup | null = null;
  #state: WindowState | null = null;
  #callers = new Map<string, Caller>();
  /** Items `open` opened whose END `end` has not asked for yet. */
  readonly #answers = new Map<string, AnswerSink>();
  #batches = new Map<string, OpenBatch>();
  #lastSentAt = new Map<string, number>();
  #timer: ReturnType<typeof setTimeout> | null = null;
  #timerAt: number | null = null;
  #alarmArmed = false;
  #nextSeq = 1;
  #recent: BatchRecord[] = [];
  /** `open_batches` writes, keyed `batch:<id>`. */
  readonly #records = new WriteBehind(this.ctx.storage, OPEN_BATCH_RECORD_DELAY_MS);
  // Batch ids must not collide with calls an earlier incarnation may still have running.
  readonly #incarnation = crypto.randomUUID().slice(0, 8);
  /** When each origin last answered an item with a 5xx (cleared by its next success). */
  #failedAt = new Map<string, number>();
  readonly #inTurn = chooseLeastLoadedInTurn((id) => this.#lastSentAt.get(id) ?? null);
  readonly #options: WindowOptions = {
    // Origins that failed an item recently are tried last, as the edge's pool does for
    // the unbatched path: still used when nothing else can take the request.
    chooseOrigin: (candidates, head) => {
      const now = Date.now();
      const quarantineMs = this.#setup?.quarantineMs ?? 0;
      const fresh = candidates.filter(
        (c) => (this.#failedAt.get(c.id) ?? Number.NEGATIVE_INFINITY) + quarantineMs <= now,
      );
      return this.#inTurn(fresh, head) ?? this.#inTurn(candidates, head);
    },
  };
  #counters: BatcherCounters = {
    submitted: 0,
    dispatchedAtOnce: 0,
    queued: 0,
    refusedQueueFull: 0,
    refusedOther: 0,
    queueTimeouts: 0,
    cancelledWaiting: 0,
    cancelledRunning: 0,
    failedBeforeHead: 0,
    batches: { idle: 0, size: 0, tokens: 0, window: 0 },
    batchItems: 0,
    batchSizes: {},
    orphansCancelled: 0,
    readPauses: 0,
    holds: 0,
  };

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(() => this.#migrate());
  }

  /**
   * Admits one request attempt: refuses it at once (full lane, no origin), or queues or
   * sends it and returns its frame stream (see the top of this file).
   */
  submit(input: BatcherSubmit): BatcherSubmitResult {
    const admitted = this.#enqueue(input, () => {
      // Native streams: the runtime pumps them to the caller without running JavaScript
      // per chunk, and the buffer lets a slow caller fall behind without holding up the
      // call its neighbours share.
      const { readable, writable } = new IdentityTransformStream({
        highWaterMark: CALLER_BUFFER_BYTES,
      });
      const writer = writable.getWriter();
      // Rejects when the caller cancelled its stream (noticed by the runtime at a write).
      writer.closed.catch(() => this.#callerGone(input.id));
      return { sink: new FrameStreamSink(writer), frames: readable };
    });
    if (admitted.kind !== "accepted") return admitted;
    return { kind: "accepted", frames: admitted.connection.frames, atOnce: admitted.atOnce };
  }

  /**
   * Admits one request attempt whose client gets its answer whole (JSON), and answers once
   * its item ended, with its HEAD, body and END in one answer: no stream to set up and no
   * frames to relay; or at once with a refusal. A caller that goes away cancels its item
   * with `cancel` (with `untilEnd`, the END still brings the usage generated until then).
   */
  async answer(input: BatcherSubmit): Promise<BatcherAnswerResult> {
    const admitted = this.#enqueue(input, () => ({ sink: new WholeSink() }));
    if (admitted.kind !== "accepted") return admitted;
    const whole = await admitted.connection.sink.done;
    return {
      kind: "answered",
      head: whole.head as BatcherHead | null,
      headMs: whole.headMs,
      body: whole.body,
      trailer: whole.trailer,
      atOnce: admitted.atOnce,
    };
  }

  /**
   * Admits one streamed request attempt, whose body goes on a stream of its own, and
   * answers at its HEAD with that stream; or at once with a refusal, or with the trailer of
   * an END that came before any HEAD. The item's END comes from {@link end}, which the
   * caller asks for at once, right behind this call (see the top of this file).
   */
  async open(input: BatcherSubmit): Promise<BatcherOpenResult> {
    const sink = new AnswerSink();
    const admitted = this.#enqueue(input, () => {
      // The caller hands this one to its client as it is. Should this object go away, the
      // runtime errors it (a stream returned over RPC that is cut), so the client is never
      // left waiting on a body nobody writes.
      const { readable, writable } = new IdentityTransformStream({
        highWaterMark: BODY_BUFFER_BYTES,
      });
      return { sink, body: new ClientBody(writable, input.setup.clientBacklogBytes), readable };
    });
    if (admitted.kind !== "accepted") return admitted;
    const { connection, atOnce } = admitted;
    this.#answers.set(input.id, sink);
    const opening = await sink.opened;
    switch (opening.kind) {
      case "head":
        return {
          kind: "open",
          head: opening.head as BatcherHead,
          body: connection.readable,
          atOnce,
        };
      case "ended":
        this.#answers.delete(input.id);
        return {
          kind: "ended",
          trailer: decodeJsonPayload(opening.trailer) as BatcherFailureTrailer,
          atOnce,
        };
      case "closed":
        this.#answers.delete(input.id);
        return { kind: "cancelled" };
      default:
        return assertNever(opening);
    }
  }

  /**
   * The END of an item `open` admitted: its trailer's JSON bytes as the origin sent them, once
   * they come (for an item that ended before its HEAD, the lone END `open` answered with);
   * null when the item was cut or cancelled without an END, or when this object does not
   * know the item (it was refused, or `end` came twice).
   */
  async end(id: string): Promise<Uint8Array | null> {
    const sink = this.#answers.get(id);
    if (sink === undefined) return null;
    this.#answers.delete(id);
    return sink.ended;
  }

  /**
   * Admission shared by `answer`, `open` and `submit`; `connect` makes the caller's sink,
   * and its client's body when the body has a stream of its own.
   */
  #enqueue<C extends { sink: CallerSink; body?: ClientBody }>(
    input: BatcherSubmit,
    connect: () => C,
  ): BatcherNotAdmitted | { kind: "accepted"; connection: C; atOnce: boolean } {
    const now = Date.now();
    let state = this.#configure(input.setup, now);
    if (input.recentFirstByteMs !== undefined && input.recentFirstByteMs !== null) {
      state = recordFirstByteWait(state, input.recentFirstByteMs, now);
      this.#state = state;
    }
    this.#counters.submitted += 1;
    const avoid = input.avoidOrigins;
    const allowed = healthyCandidates(state, now).filter((c) => !avoid.includes(c.id));
    if (allowed.length === 0) {
      this.#counters.refusedOther += 1;
      return { kind: "failed", code: "no_healthy_origin", detail: "no healthy origin to try" };
    }
    const { state: next, decision } = enqueue(
      state,
      {
        id: input.id,
        lane: Math.min(input.lane, state.config.lanes.length - 1),
        promptTokens: input.promptTokens,
        maxTokens: input.maxTokens,
        deadline: input.deadline,
        enqueuedAt: now,
        avoidOrigins: avoid,
      },
      now,
      this.#options,
    );
    switch (decision.kind) {
      case "rejected":
        switch (decision.reason) {
          case "queue_full":
            this.#counters.refusedQueueFull += 1;
            return { kind: "refused", reason: "queue_full", retryAfterMs: decision.retryAfterMs };
          case "too_large":
            this.#counters.refusedOther += 1;
            return {
              kind: "failed",
              code: "prompt_too_large",
              detail: `the prompt exceeds every origin's KV cache (${decision.capacityTokens} tokens)`,
            };
          case "duplicate_id":
            this.#counters.refusedOther += 1;
            return { kind: "failed", code: "duplicate_id", detail: `item ${input.id} is known` };
          default:
            return assertNever(decision);
        }
      case "dispatch-now": {
        this.#state = next;
        const connection = this.#admit(input, connect);
        this.#counters.dispatchedAtOnce += 1;
        this.#send(decision.batch, now);
        return { kind: "accepted", connection, atOnce: true };
      }
      case "queued": {
        this.#state = next;
        const connection = this.#admit(input, connect);
        this.#counters.queued += 1;
        if (decision.flushAt <= now) this.#flush(now);
        else this.#schedule(decision.flushAt);
        this.#armAlarm();
        return { kind: "accepted", connection, atOnce: false };
      }
      default:
        return assertNever(decision);
    }
  }

  /**
   * Cancels an item (its client went away): a waiting one leaves the queue, a running one
   * is cancelled on its origin. Cancelling the item's stream does the same, but the runtime
   * tells this object of that only at the stream's next write, which for a waiting item may
   * be long after. False when the item had already ended.
   */
  cancel(id: string, options: BatcherCancelOptions = {}): boolean {
    if (options.timedOut === true) {
      if (this.#callers.get(id)?.stage === "queued") return false;
      this.#endBody(id, "timeout");
    }
    return options.untilEnd === true ? this.#cancelUntilEnd(id) : this.#callerGone(id);
  }

  /** Counters and the window's current view. */
  snapshot(): BatcherSnapshot {
    const now = Date.now();
    const inFlight: Record<string, number> = {};
    const origins: BatcherSnapshot["origins"] = {};
    for (const origin of this.#state?.origins ?? []) {
      inFlight[origin.id] = origin.inFlight.length;
      const { report } = origin;
      origins[origin.id] = report === null ? null : { ...report, ageMs: now - report.receivedAt };
    }
    this.#records.flush();
    const persisted = this.ctx.storage.sql
      .exec<{ n: number }>("SELECT COUNT(*) AS n FROM open_batches")
      .one().n;
    return {
      version: this.#setup?.version ?? null,
      queued: this.#state === null ? 0 : queuedCount(this.#state),
      windowMs: this.#state === null ? 0 : currentWindowMs(this.#state, now),
      threadLagMs: this.#state === null ? 0 : meanThreadLagMs(this.#state, now),
      holdMs: this.#state === null ? 0 : tokenHoldMs(this.#state, now),
      inFlight,
      origins,
      openBatches: this.#batches.size,
      persistedBatches: persisted,
      counters: structuredClone(this.#counters),
      recentBatches: structuredClone(this.#recent),
    };
  }

  /** Backstop: flushes what is due, cancels orphaned calls, and re-arms while work remains. */
  override async alarm(): Promise<void> {
    this.#alarmArmed = false;
    if (this.#state !== null && queuedCount(this.#state) > 0) this.#flush(Date.now());
    await this.#cancelOrphans();
    if (this.#busy()) this.#armAlarm();
  }

  // --- admission and flushing -------------------------------------------------------

  /** Uses `setup` unless one is already in use: a name's setup never changes (see top). */
  #configure(setup: BatcherSetup, now: number): WindowState {
    if (this.#state !== null && this.#setup !== null) {
      if (this.#setup.version === setup.version || this.#busy()) return this.#state;
    }
    this.#setup = setup;
    this.#state = createWindowState(WindowConfigSchema.parse(setup.window), now);
    this.#lastSentAt.clear();
    this.#failedAt.clear();
    return this.#state;
  }

  /** Registers an admitted caller with what `connect` makes for it, and returns that. */
  #admit<C extends { sink: CallerSink; body?: ClientBody }>(
    input: BatcherSubmit,
    connect: () => C,
  ): C {
    const connection = connect();
    const caller: Caller = {
      input,
      stage: "queued",
      sink: connection.sink,
      body: connection.body ?? null,
      batch: null,
      headTimer: null,
      status: null,
      cancelling: false,
      firstByte: false,
    };
    this.#callers.set(input.id, caller);
    // The client went away: its usage so far is still billed, so the END must reach the caller.
    caller.body?.closed.catch(() => {
      if (this.#callers.get(input.id) === caller) this.#cancelUntilEnd(input.id);
    });
    return connection;
  }

  #flush(now: number): void {
    if (this.#state === null) return;
    const result = tick(this.#state, now, this.#options);
    this.#state = result.state;
    for (const notice of result.notices) {
      const caller = this.#callers.get(notice.item.id);
      switch (notice.kind) {
        case "timed-out": {
          this.#counters.queueTimeouts += 1;
          const lane = result.state.config.lanes[notice.item.lane];
          const status = lane?.timeoutStatus ?? 503;
          if (caller !== undefined) {
            this.#fail(caller, "queue_timeout", "The request waited too long for capacity.", {
              status,
              retry_after_ms: 1_000,
            });
          }
          break;
        }
        case "too-large":
          if (caller !== undefined) {
            this.#fail(caller, "prompt_too_large", "The prompt exceeds every origin's KV cache.");
          }
          break;
        case "overdue":
          // A `wait` lane keeps it queued; the caller's own deadline still applies at the edge.
          break;
        default:
          assertNever(notice);
      }
    }
    for (const batch of result.batches) this.#send(batch, now);
    if (result.nextWakeAt !== null) this.#schedule(result.nextWakeAt);
  }

  #schedule(at: number): void {
    if (this.#timerAt !== null && this.#timerAt <= at) return;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timerAt = at;
    // A timer, not an alarm: windows are milliseconds and alarms are too coarse for them.
    this.#timer = setTimeout(
      () => {
        this.#timer = null;
        this.#timerAt = null;
        this.#flush(Date.now());
      },
      Math.max(0, at - Date.now()),
    );
  }

  // --- upstream calls -----------------------------------------------------------------

  #send(batch: Batch, now: number): void {
    const setup = this.#setup;
    if (setup === null) throw new Error("batch without a setup");
    const origin = setup.origins.find((o) => o.id === batch.originId);
    if (origin === undefined) throw new Error(`no URL for origin ${batch.originId}`);
    const callers: Caller[] = [];
    for (const entry of batch.items) {
      const caller = this.#callers.get(entry.id);
      if (caller === undefined) throw new Error(`batched item ${entry.id} has no caller`);
      callers.push(caller);
    }
    const open: OpenBatch = {
      id: `${this.#incarnation}-${this.#nextSeq++}`,
      originId: origin.id,
      url: origin.url,
      callers,
      done: new Set(),
      abort: new AbortController(),
      abortReason: null,
      held: new Set(),
      holdTimer: null,
    };
    for (const caller of callers) {
      caller.stage = "sent";
      caller.batch = open;
      if (caller.input.timeHead) {
        caller.headTimer = setTimeout(
          () => this.#headTimeout(caller),
          caller.input.firstByteTimeoutMs,
        );
      }
    }
    this.#batches.set(open.id, open);
    this.#lastSentAt.set(origin.id, now);
    this.#counters.batches[batch.reason] += 1;
    this.#counters.batchItems += callers.length;
    const bucket = sizeBucket(callers.length);
    this.#counters.batchSizes[bucket] = (this.#counters.batchSizes[bucket] ?? 0) + 1;
    this.#recent.push({
      batchId: open.id,
      originId: origin.id,
      reason: batch.reason,
      items: callers.map((c) => c.input.id),
    });
    if (this.#recent.length > RECENT_BATCHES) this.#recent.shift();
    const itemIds = JSON.stringify(callers.map((c) => c.input.id));
    this.#records.set(recordKey(open.id), () =>
      this.ctx.storage.sql.exec(
        "INSERT INTO open_batches (batch_id, origin_id, origin_url, sent_at, item_ids) VALUES (?, ?, ?, ?, ?)",
        open.id,
        origin.id,
        origin.url,
        now,
        itemIds,
      ),
    );
    this.#armAlarm();
    this.ctx.waitUntil(this.#runBatch(open));
  }

  async #runBatch(batch: OpenBatch): Promise<void> {
    const lanes = this.#state?.config.lanes.length ?? 1;
    const envelope: BatchRequest = {
      v: BATCH_PROTOCOL_VERSION,
      batch_id: batch.id,
      items: batch.callers.map(({ input }) => ({
        id: input.id,
        path: input.path,
        headers: input.headers,
        body: input.body,
        timeout_ms: input.itemTimeoutMs,
        // The protocol runs higher priorities first; lane 0 is the highest.
        priority: lanes - 1 - input.lane,
      })),
    };
    const callTimeoutMs = Math.max(...batch.callers.map((c) => c.input.firstByteTimeoutMs));
    const callTimer = setTimeout(() => {
      batch.abortReason = "timeout";
      batch.abort.abort("first byte timeout");
    }, callTimeoutMs);
    let response: Response;
    try {
      response = await postBatch(this.#upstream(batch.url), envelope, batch.abort.signal);
    } catch (error) {
      clearTimeout(callTimer);
      if (batch.abortReason === "all-cancelled") {
        this.#callEnded(batch, null);
        return;
      }
      const timedOut = batch.abortReason === "timeout";
      this.#callFailed(
        batch,
        timedOut ? "origin_timeout" : "origin_unavailable",
        `connect: ${describe(error)}`,
        !timedOut,
      );
      return;
    }
    clearTimeout(callTimer);
    const problem = batchAnswerProblem(response);
    if (problem !== null || response.body === null) {
      await response.body?.cancel().catch(() => {});
      this.#callFailed(
        batch,
        problem?.failure === "unavailable" ? "origin_unavailable" : "origin_error",
        problem?.detail ?? "no body",
        true,
      );
      return;
    }

    const reader = response.body.getReader();
    const decoder = new FrameDecoder();
    let broken: string | null = null;
    try {
      let turnStartedAt = Date.now();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        this.#onFrames(batch, decoder.push(value));
        // When the origin's answer is already buffered, each read is answered at once, and
        // a busy call could keep the thread through its whole answer while the streams it
        // just wrote to, other calls and new requests all wait: their first bytes then
        // come in bursts, hundreds of ms apart, when the thread is saturated. So the read
        // gives way every READ_TURN_MS, behind a zero-delay timer, and how late that timer
        // fires is how saturated the thread is, which the window's wait term weighs.
        const readAt = Date.now();
        if (readAt - turnStartedAt >= READ_TURN_MS) {
          this.#counters.readPauses += 1;
          await new Promise((resolve) => setTimeout(resolve, 0));
          turnStartedAt = Date.now();
          const lagMs = turnStartedAt - readAt;
          this.#state = this.#core((s) => recordThreadLag(s, lagMs, turnStartedAt));
        }
      }
      decoder.finish();
    } catch (error) {
      broken = batch.abortReason === "all-cancelled" ? null : describe(error);
    }
    this.#callEnded(batch, broken);
  }

  /** Applies one origin chunk's frames; each caller gets its share in one write. */
  #onFrames(batch: OpenBatch, frames: readonly Frame[]): void {
    if (frames.length === 0) return;
    const now = Date.now();
    let freed = false;
    // Callers with frames of this chunk, each once: `pending` is empty between chunks.
    const touched = new Set<Caller>();
    // Callers whose HEAD or first DATA came in this chunk: never held.
    const fresh = new Set<Caller>();
    for (const frame of frames) {
      if (frame.type === FrameType.LOAD) {
        const report = decodeJsonPayload(frame.payload) as LoadReport;
        this.#state = this.#core((s) => onOriginLoad(s, batch.originId, report, now).state);
        freed = true;
        continue;
      }
      const caller = batch.callers[frame.item];
      if (caller === undefined) continue;
      switch (frame.type) {
        case FrameType.HEAD:
          if (caller.stage !== "sent") break;
          caller.stage = "open";
          this.#clearHeadTimer(caller);
          const head = decodeJsonPayload(frame.payload) as ItemHead;
          caller.status = head.status;
          if (head.status >= 500) this.#failedAt.set(batch.originId, now);
          else this.#failedAt.delete(batch.originId);
          // The caller learns which origin serves it from an added `origin` field.
          const withOrigin = { ...head, origin: batch.originId };
          touched.add(caller);
          fresh.add(caller);
          caller.sink.head(withOrigin);
          break;
        case FrameType.DATA:
          if (!caller.firstByte) {
            // The wait term of the window learns how long first bytes take.
            caller.firstByte = true;
            fresh.add(caller);
            // Edges that report what their requests waited (more than this object sees)
            // are counted by their reports, not twice.
            const countWait = caller.input.recentFirstByteMs === undefined;
            this.#state = this.#core(
              (s) => onDispatched(s, batch.originId, caller.input.id, now, { countWait }).state,
            );
          }
          if (caller.stage !== "open") break;
          touched.add(caller);
          if (caller.body !== null) caller.body.push(frame.payload);
          else caller.sink.data(frame.payload);
          break;
        case FrameType.END:
          if (batch.done.has(frame.item)) break;
          batch.done.add(frame.item);
          this.#state = this.#core(
            (s) => onItemDone(s, batch.originId, caller.input.id, now).state,
          );
          freed = true;
          if (caller.stage === "open") {
            touched.add(caller);
            if (caller.body !== null) {
              const trailer = decodeJsonPayload(frame.payload) as ItemTrailer;
              if (trailer.outcome !== "ok") failBody(caller, trailer.outcome === "timeout");
              endWhenTaken(caller.sink, caller.body, frame.payload, trailer);
            } else {
              caller.sink.end(frame.payload);
            }
            caller.stage = "ended";
            this.#callers.delete(caller.input.id);
          } else if (caller.stage === "sent") {
            // Origins always answer a HEAD first; an END alone is a broken origin.
            const trailer = decodeJsonPayload(frame.payload) as ItemTrailer;
            this.#failSent(
              caller,
              trailer.outcome === "timeout" ? "origin_timeout" : "origin_error",
              `item ended before its HEAD: ${trailer.error?.message ?? trailer.outcome}`,
              batch.originId,
            );
          }
          break;
      }
    }
    // Written now, not from a zero-delay timer: the runtime hands over a response body one
    // HTTP chunk per read, each in a turn of its own that even a zero-delay timer precedes,
    // so such a wait joins nothing, and every timer that fires in a Durable Object costs
    // about as much as relaying a frame. Origins that write a turn's frames as one chunk get
    // them joined here. Only while this object's thread lags are a streamed item's later
    // tokens held, for a share of that lag, so that the chunks of several engine steps leave
    // in one write (see `tokenHoldMs`); its HEAD, first token and END never wait.
    const holdMs = this.#state === null ? 0 : tokenHoldMs(this.#state, now);
    for (const caller of touched) {
      if (holdMs > 0 && caller.body !== null && caller.stage === "open" && !fresh.has(caller)) {
        batch.held.add(caller);
        continue;
      }
      batch.held.delete(caller);
      this.#deliver(caller);
    }
    if (batch.held.size > 0 && batch.holdTimer === null) this.#armHold(batch, holdMs, now);
    if (freed && this.#state !== null && queuedCount(this.#state) > 0) this.#flush(now);
  }

  /**
   * Delivers the call's held callers in `holdMs`. How late the timer fires is the thread's
   * lag, which keeps the hold's measure current while tokens are held.
   */
  #armHold(batch: OpenBatch, holdMs: number, now: number): void {
    const due = now + holdMs;
    this.#counters.holds += 1;
    batch.holdTimer = setTimeout(() => {
      batch.holdTimer = null;
      const firedAt = Date.now();
      this.#state = this.#core((s) => recordThreadLag(s, Math.max(0, firedAt - due), firedAt));
      this.#deliverHeld(batch);
    }, holdMs);
  }

  #deliverHeld(batch: OpenBatch): void {
    const held = [...batch.held];
    batch.held.clear();
    for (const caller of held) this.#deliver(caller);
  }

  /** The call failed before any frame: every item fails before its HEAD. */
  #callFailed(
    batch: OpenBatch,
    code: BatcherFailureCode,
    detail: string,
    quarantine: boolean,
  ): void {
    const now = Date.now();
    console.warn("batch call failed", batch.id, batch.originId, detail);
    for (const [index, caller] of batch.callers.entries()) {
      this.#closeAccounting(batch, index, now);
      if (caller.stage === "sent") this.#failSent(caller, code, detail, batch.originId);
    }
    if (quarantine) this.#quarantine(batch.originId, now);
    this.#forget(batch, now);
  }

  /** The call's response ended: items without an END end now (failed or cut off). */
  #callEnded(batch: OpenBatch, broken: string | null): void {
    const now = Date.now();
    let cut = false;
    for (const [index, caller] of batch.callers.entries()) {
      if (batch.done.has(index)) continue;
      this.#closeAccounting(batch, index, now);
      switch (caller.stage) {
        case "sent":
          cut = true;
          this.#failSent(caller, "origin_error", broken ?? "batch ended early", batch.originId);
          break;
        case "open":
          // After HEAD the caller has bytes: a stream without END tells it the item was cut,
          // and a body of its own ends with the error event.
          cut = true;
          failBody(caller, false);
          caller.stage = "ended";
          this.#callers.delete(caller.input.id);
          this.#deliver(caller);
          break;
        case "queued":
        case "ended":
          break;
        default:
          assertNever(caller.stage);
      }
    }
    if (cut && batch.abortReason === null) {
      console.warn("batch response cut", batch.id, batch.originId, broken ?? "no final frames");
      this.#quarantine(batch.originId, now);
    }
    this.#forget(batch, now);
  }

  #closeAccounting(batch: OpenBatch, index: number, now: number): void {
    if (batch.done.has(index)) return;
    batch.done.add(index);
    const caller = batch.callers[index];
    if (caller === undefined) return;
    this.#clearHeadTimer(caller);
    this.#state = this.#core((s) => onItemDone(s, batch.originId, caller.input.id, now).state);
  }

  #forget(batch: OpenBatch, now: number): void {
    this.#batches.delete(batch.id);
    if (batch.holdTimer !== null) clearTimeout(batch.holdTimer);
    batch.holdTimer = null;
    this.#deliverHeld(batch);
    const key = recordKey(batch.id);
    // Still queued: the row was never written, so there is nothing to delete.
    if (!this.#records.delete(key)) {
      this.#records.set(key, () =>
        this.ctx.storage.sql.exec("DELETE FROM open_batches WHERE batch_id = ?", batch.id),
      );
    }
    if (this.#state !== null && queuedCount(this.#state) > 0) this.#flush(now);
  }

  #quarantine(originId: string, now: number): void {
    this.#failedAt.set(originId, now);
    const until = now + (this.#setup?.quarantineMs ?? 0);
    this.#state = this.#core((s) => markOriginDown(s, originId, until).state);
  }

  #headTimeout(caller: Caller): void {
    caller.headTimer = null;
    const batch = caller.batch;
    if (caller.stage !== "sent" || batch === null) return;
    this.#cancelRunning(caller, batch, true, true);
    this.#failSent(
      caller,
      "origin_timeout",
      "no answer within the first-byte timeout",
      batch.originId,
    );
  }

  #clearHeadTimer(caller: Caller): void {
    if (caller.headTimer === null) return;
    clearTimeout(caller.headTimer);
    caller.headTimer = null;
  }

  // --- callers ------------------------------------------------------------------------

  /** The caller cancelled its item (its client went away); false when it had ended. */
  #callerGone(id: string): boolean {
    const caller = this.#callers.get(id);
    if (caller === undefined) return false;
    const now = Date.now();
    this.#callers.delete(id);
    const previous = caller.stage;
    caller.stage = "ended";
    this.#clearHeadTimer(caller);
    caller.sink.close();
    // Aborted, never closed: a clean end would pass a cut answer off as a whole one.
    caller.body?.abort("item cancelled");
    caller.body = null;
    if (previous === "queued") {
      this.#state = this.#core((s) => cancelInWindow(s, id, now).state);
      this.#counters.cancelledWaiting += 1;
      return true;
    }
    if (caller.batch !== null && (previous === "sent" || previous === "open")) {
      if (!caller.cancelling) this.#counters.cancelledRunning += 1;
      this.#cancelRunning(caller, caller.batch, true, !caller.cancelling);
    }
    return true;
  }

  /** Cancels a running item on its origin but keeps its stream open for its END. */
  #cancelUntilEnd(id: string): boolean {
    const caller = this.#callers.get(id);
    if (caller === undefined) return false;
    if (caller.batch === null || caller.stage === "queued") return this.#callerGone(id);
    if (caller.cancelling) return true;
    caller.cancelling = true;
    this.#counters.cancelledRunning += 1;
    // Never by closing the call: the END with the item's usage must still come through it.
    this.#cancelRunning(caller, caller.batch, false, true);
    return true;
  }

  /**
   * Stops a running item on its origin. When nothing else in its call is still wanted,
   * closing the call does it (the origin cancels every unfinished item of a dropped call)
   * and saves a request; otherwise the origin's cancel endpoint stops just this item.
   */
  #cancelRunning(
    caller: Caller,
    batch: OpenBatch,
    mayCloseCall: boolean,
    askOrigin: boolean,
  ): void {
    const now = Date.now();
    this.#state = this.#core((s) => cancelInWindow(s, caller.input.id, now).state);
    const wanted = batch.callers.some(
      (other, index) => other !== caller && !batch.done.has(index) && other.stage !== "ended",
    );
    if (mayCloseCall && !wanted) {
      batch.abortReason = "all-cancelled";
      batch.abort.abort("every item was cancelled");
      return;
    }
    // Already asked (a cancel until END that the caller then stopped waiting for).
    if (!askOrigin) return;
    this.ctx.waitUntil(
      cancelBatchItems(this.#upstream(batch.url), batch.id, [caller.input.id]).then((ok) => {
        if (!ok) console.warn("origin cancel failed", batch.id, batch.originId, caller.input.id);
      }),
    );
  }

  #deliver(caller: Caller): void {
    const body = caller.body;
    body?.flush();
    caller.sink.flush();
    if (caller.stage !== "ended") return;
    caller.sink.close();
    if (body !== null) {
      body.close();
      caller.body = null;
    }
  }

  /**
   * Ends a running item's body stream with an error event, as its caller gave up on
   * it (`cancel` with `timedOut`); the item itself is cancelled by the caller's `cancel`.
   */
  #endBody(id: string, why: "timeout"): void {
    const caller = this.#callers.get(id);
    if (caller === undefined || caller.body === null || caller.stage !== "open") return;
    failBody(caller, why === "timeout");
    caller.body.close();
    caller.body = null;
  }

  /** An item that had left the queue failed before its HEAD. */
  #failSent(caller: Caller, code: BatcherFailureCode, detail: string, originId: string): void {
    this.#counters.failedBeforeHead += 1;
    this.#fail(caller, code, detail, { origin: originId });
  }

  /** Ends a caller's stream with a lone END saying why it never started. */
  #fail(
    caller: Caller,
    code: BatcherFailureCode,
    message: string,
    extra: Pick<BatcherFailureTrailer, "origin" | "status" | "retry_after_ms"> = {},
  ): void {
    if (caller.stage === "ended") return;
    caller.stage = "ended";
    this.#clearHeadTimer(caller);
    this.#callers.delete(caller.input.id);
    const trailer: BatcherFailureTrailer = {
      id: caller.input.id,
      outcome: code === "queue_timeout" || code === "origin_timeout" ? "timeout" : "error",
      usage: null,
      error: { message, type: "server_error", code },
      ...extra,
    };
    caller.sink.end(encodeJsonPayload(trailer));
    // A body stream had no bytes yet: aborted, never closed (the caller answers from the END).
    caller.body?.abort("item failed before its HEAD");
    caller.body = null;
    this.#deliver(caller);
  }

  // --- persistence and the alarm ------------------------------------------------------

  #busy(): boolean {
    return this.#batches.size > 0 || (this.#state !== null && queuedCount(this.#state) > 0);
  }

  #armAlarm(): void {
    if (this.#alarmArmed) return;
    this.#alarmArmed = true;
    this.ctx.waitUntil(this.ctx.storage.setAlarm(Date.now() + ALARM_BACKSTOP_MS));
  }

  async #cancelOrphans(): Promise<void> {
    this.#records.flush();
    const rows = this.ctx.storage.sql
      .exec<BatchRow>("SELECT batch_id, origin_id, origin_url FROM open_batches")
      .toArray()
      .filter((row) => !this.#batches.has(row.batch_id));
    await Promise.all(
      rows.map(async (row) => {
        // Without ids the origin cancels every unfinished item of the call.
        const ok = await cancelBatchItems(this.#upstream(row.origin_url), row.batch_id);
        if (!ok) console.warn("orphaned batch cancel failed", row.batch_id, row.origin_id);
        this.#counters.orphansCancelled += 1;
        this.ctx.storage.sql.exec("DELETE FROM open_batches WHERE batch_id = ?", row.batch_id);
      }),
    );
  }

  // An origin as the upstream client calls it, with the edge's access token for origins.
  #upstream(url: string): UpstreamOrigin {
    return { url, token: this.env.ORIGIN_TOKEN };
  }

  async #migrate(): Promise<void> {
    applyMigrations(this.ctx.storage, MIGRATIONS);
    const sql = this.ctx.storage.sql;
    // Every row left from before this incarnation is a call an origin may still run.
    const orphans = sql.exec<{ n: number }>("SELECT COUNT(*) AS n FROM open_batches").one().n;
    if (orphans > 0) {
      this.#alarmArmed = true;
      await this.ctx.storage.setAlarm(Date.now());
    }
  }

  #core(step: (state: WindowState) => WindowState): WindowState | null {
    return this.#state === null ? null : step(this.#state);
  }
}

/** The write-behind key of a call's `open_batches` row. */
function recordKey(batchId: string): string {
  return `batch:${batchId}`;
}

/** The histogram bucket of a batch size: `1`, `2`, `3-4`, `5-8`, `9-16`, … */
export function sizeBucket(size: number): string {
  if (size <= 2) return String(size);
  let upper = 4;
  while (upper < size) upper *= 2;
  return `${upper / 2 + 1}-${upper}`;
}

/**
 * Queues the SSE error event that ends the body stream of an item that failed after its
 * HEAD. An engine's own error answer (a 4xx) is whole as it is, and gets none.
 */
/**
 * Answers a body's END once its client has taken the whole body: the caller settles the
 * request on it, and a body its client left before the end is not `ok` but `cancelled`
 * (billed, as any cancel, for what was generated).
 */
function endWhenTaken(
  sink: CallerSink,
  body: ClientBody,
  payload: Uint8Array,
  trailer: ItemTrailer,
): void {
  if (!(sink instanceof AnswerSink)) {
    sink.end(payload);
    return;
  }
  sink.endAfter(
    body.closed.then(
      () => payload,
      () =>
        trailer.outcome === "ok"
          ? encodeJsonPayload({ ...trailer, outcome: "cancelled" } satisfies ItemTrailer)
          : payload,
    ),
  );
}

function failBody(caller: Caller, timedOut: boolean): void {
  if (caller.body === null || (caller.status ?? 0) >= 400) return;
  caller.body.push(errorEvent(originFailure(timedOut ? "timeout" : "bad_answer")));
}

function assertNever(value: never): never {
  throw new Error(`unhandled case ${JSON.stringify(value)}`);
}
