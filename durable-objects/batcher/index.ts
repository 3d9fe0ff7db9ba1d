/**
 * Batcher: one Durable Object per region, model, shard and settings version
 * (docs/batching.md). Requests gather in priority lanes and leave as batches over the
 * origin batch protocol, one upstream call per flush and origin; each caller gets its own
 * item back. RPC: `answer` (a JSON item, answered whole at its END), `open` and `end` (a
 * streamed item: its HEAD with a body stream, then its END), `cancel`, `snapshot`. The
 * policy is the pure core in `window.ts`; the queue, callers and calls are in modules of
 * their own, and the table of open calls in `records.ts`.
 */
import { logWarn } from "../../contracts/log.ts";
import { DurableObject } from "cloudflare:workers";
import { cancelBatchItems, currentUpstream } from "../../contracts/upstream.ts";
import { assertNever } from "./caller.ts";
import { AnswerSink, type CallerSink, WholeSink } from "./caller-sink.ts";
import { Callers } from "./callers.ts";
import { Calls } from "./calls.ts";
import { ClientBody } from "./client-body.ts";
import { newCounters } from "./counters.ts";
import { OriginLinks } from "./origin-links.ts";
import { Queue } from "./queue.ts";
import { CallRecords } from "./records.ts";
import { RoutingLink } from "./routing-link.ts";
import { snapshotOf } from "./snapshot.ts";
import {
  ALARM_BACKSTOP_MS,
  BODY_BUFFER_BYTES,
  type BatcherAnswerResult,
  type BatcherAttempt,
  type BatcherCancelOptions,
  type BatcherEnd,
  type BatcherHead,
  type BatcherNotAdmitted,
  type BatcherOpenResult,
  type BatcherSnapshot,
  failureTrailerOf,
} from "./types.ts";
import {
  type TickNotice,
  enqueue,
  healthyCandidates,
  recordFirstByteWait,
} from "./window/index.ts";

/** Micro-batching window, lanes and demultiplexing for one region, model and shard. */
export class Batcher extends DurableObject<Env> {
  readonly #counters = newCounters();
  readonly #records = new CallRecords(this.ctx.storage);
  readonly #routing = new RoutingLink(this.ctx.storage);
  readonly #queue = new Queue({
    send: (batch, now) => this.#calls.send(batch, now),
    notice: (notice) => this.#notice(notice),
  });
  readonly #callers: Callers = new Callers(this.#queue, this.#counters, (...args) =>
    this.#calls.stop(...args),
  );
  readonly #links = new OriginLinks(
    this.env,
    (work) => this.ctx.waitUntil(work),
    (changed) => {
      for (const origin of this.#queue.breakersChanged(changed, Date.now())) {
        this.#calls.abandon(origin);
      }
    },
  );
  readonly #calls: Calls = new Calls({
    queue: this.#queue,
    callers: this.#callers,
    counters: this.#counters,
    records: this.#records,
    waitUntil: (work) => this.ctx.waitUntil(work),
    upstream: (id, url) => this.#links.credentialed(this.#queue.setup, id, url),
    armAlarm: () => this.#armAlarm(),
    outcome: (origin, verdict) => this.#links.outcome(this.#queue.setup, origin, verdict),
  });
  /** Items `open` opened whose END `end` has not asked for yet. */
  readonly #answers = new Map<string, AnswerSink>();
  #alarmArmed = false;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      // Every row left from before this incarnation is a call an origin may still run.
      if (this.#records.migrate() > 0) {
        this.#alarmArmed = true;
        await ctx.storage.setAlarm(Date.now());
      }
    });
  }

  /**
   * Admits one request attempt whose client gets its answer whole (JSON), and answers once
   * its item ended, with its HEAD, body and END in one answer; or at once with a refusal. A
   * caller that goes away cancels its item with `cancel` (with `untilEnd`, the END still
   * brings the usage generated until then).
   */
  async answer(input: BatcherAttempt): Promise<BatcherAnswerResult> {
    const sink = new WholeSink();
    const admitted = await this.#admit(input, sink, null);
    if (admitted.kind !== "accepted") return admitted;
    const whole = await sink.done;
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
   * Admits one streamed request attempt, whose body goes on a stream of its own that the
   * caller hands its client as it is, and answers at its HEAD with that stream; or at once
   * with a refusal, or with the trailer of an END that came before any HEAD. The item's END
   * comes from {@link end}, which the caller asks for right behind this call: calls to one
   * stub arrive in order, so `end` finds the item this call registered.
   */
  async open(input: BatcherAttempt): Promise<BatcherOpenResult> {
    const sink = new AnswerSink();
    // Should this object go away, the runtime errors a stream returned over RPC, so the
    // client is never left waiting on a body nobody writes.
    const { readable, writable } = new IdentityTransformStream({
      highWaterMark: BODY_BUFFER_BYTES,
    });
    const body = new ClientBody(writable, input.setup.clientBacklogBytes);
    // Known before admission may wait (a breaker refresh): `end` may come meanwhile.
    this.#answers.set(input.id, sink);
    const admitted = await this.#admit(input, sink, body);
    if (admitted.kind !== "accepted") {
      this.#answers.delete(input.id);
      sink.close();
      return admitted;
    }
    const opening = await sink.opened;
    switch (opening.kind) {
      case "head":
        return {
          kind: "open",
          head: opening.head as BatcherHead,
          body: readable,
          atOnce: admitted.atOnce,
        };
      case "ended":
        this.#answers.delete(input.id);
        return {
          kind: "ended",
          trailer: failureTrailerOf(input.id, opening.trailer),
          atOnce: admitted.atOnce,
        };
      case "closed":
        this.#answers.delete(input.id);
        return { kind: "cancelled" };
      default:
        return assertNever(opening);
    }
  }

  /**
   * The END of an item `open` admitted: its trailer's JSON bytes as the origin sent them,
   * once they come (for an item that ended before its HEAD, the lone END `open` answered
   * with); null when the item was cut or cancelled without an END, or when this object
   * does not know the item (it was refused, or `end` came twice).
   */
  async end(id: string): Promise<BatcherEnd> {
    const sink = this.#answers.get(id);
    if (sink === undefined) return { trailer: null, firstByteAt: null };
    this.#answers.delete(id);
    const trailer = await sink.ended;
    // When its first body byte left, for the edge's metrics (an item may end before `end`).
    return { trailer, firstByteAt: sink.firstByteAt };
  }

  /**
   * Cancels an item (its client went away): a waiting one leaves the queue, a running one
   * is cancelled on its origin. False when the item had already ended.
   */
  cancel(id: string, options: BatcherCancelOptions = {}): boolean {
    if (options.timedOut === true) {
      if (this.#callers.get(id)?.stage === "queued") return false;
      this.#callers.timedOut(id);
    }
    return options.untilEnd === true ? this.#callers.cancelUntilEnd(id) : this.#callers.gone(id);
  }

  /** Counters and the window's current view. */
  snapshot(): BatcherSnapshot {
    return snapshotOf(this.#queue, this.#calls, this.#records.count(), this.#counters);
  }

  /** Backstop: flushes what is due, cancels orphaned calls, and re-arms while work remains. */
  override async alarm(): Promise<void> {
    this.#alarmArmed = false;
    this.#queue.flushIfQueued(Date.now());
    await this.#cancelOrphans();
    if (this.#busy()) this.#armAlarm();
  }

  /**
   * Admission shared by `answer` and `open`. A refusal for want of a healthy origin may rest
   * on a stale copy of the breakers: it is refreshed and the request admitted again.
   */
  async #admit(input: BatcherAttempt, sink: CallerSink, body: ClientBody | null) {
    const admitted = this.#enqueue(input, sink, body);
    if (admitted.kind !== "failed" || admitted.code !== "no_healthy_origin") return admitted;
    if (!(await this.#links.refresh(input.setup))) return admitted;
    // Counted once: the second try stands for the first.
    this.#counters.submitted -= 1;
    this.#counters.refusedOther -= 1;
    return this.#enqueue(input, sink, body);
  }

  #enqueue(
    input: BatcherAttempt,
    sink: CallerSink,
    body: ClientBody | null,
  ): BatcherNotAdmitted | { kind: "accepted"; atOnce: boolean } {
    const now = Date.now();
    let state = this.#queue.configure(input.setup, now, this.#busy(), this.#links.breakers);
    this.#links.sync(input.setup, now);
    if (input.recentFirstByteMs !== undefined && input.recentFirstByteMs !== null) {
      state = recordFirstByteWait(state, input.recentFirstByteMs, now);
      this.#queue.replace(state);
    }
    this.#counters.submitted += 1;
    const avoid = input.avoidOrigins;
    const usable = this.#queue.options.usable;
    const allowed = healthyCandidates(state, now, usable).filter((c) => !avoid.includes(c.id));
    if (allowed.length === 0) {
      this.#counters.refusedOther += 1;
      return { kind: "failed", code: "no_healthy_origin", detail: "no healthy origin to try" };
    }
    const health = this.#queue.health;
    const target = this.#routing.place(this.#queue.router, input, allowed, (id) =>
      health.quarantined(id, now),
    );
    const request = {
      id: input.id,
      lane: Math.min(input.lane, state.config.lanes.length - 1),
      promptTokens: input.promptTokens,
      maxTokens: input.maxTokens,
      deadline: input.deadline,
      enqueuedAt: now,
      avoidOrigins: avoid,
      ...(target !== undefined && { target }),
    };
    const { state: next, decision } = enqueue(state, request, now, this.#queue.options);
    switch (decision.kind) {
      case "rejected":
        this.#queue.router?.forget(input.id);
        this.#counters[decision.reason === "queue_full" ? "refusedQueueFull" : "refusedOther"] += 1;
        switch (decision.reason) {
          case "queue_full":
            return {
              kind: "refused",
              reason: "queue_full",
              status: state.config.lanes[request.lane]?.refuseStatus ?? 503,
              retryAfterMs: decision.retryAfterMs,
            };
          case "too_large":
            return {
              kind: "failed",
              code: "prompt_too_large",
              detail: `the prompt exceeds every origin's KV cache (${decision.capacityTokens} tokens)`,
            };
          case "duplicate_id":
            return { kind: "failed", code: "duplicate_id", detail: `item ${input.id} is known` };
          default:
            return assertNever(decision);
        }
      case "dispatch-now":
        this.#queue.replace(next);
        this.#callers.admit(input, sink, body);
        this.#counters.dispatchedAtOnce += 1;
        this.#calls.send(decision.batch, now);
        return { kind: "accepted", atOnce: true };
      case "queued":
        this.#queue.replace(next);
        this.#callers.admit(input, sink, body);
        this.#counters.queued += 1;
        if (decision.flushAt <= now) this.#queue.flush(now);
        else this.#queue.schedule(decision.flushAt);
        this.#armAlarm();
        return { kind: "accepted", atOnce: false };
      default:
        return assertNever(decision);
    }
  }

  /** An item left its lane other than in a batch. */
  #notice(notice: TickNotice): void {
    const caller = this.#callers.get(notice.item.id);
    switch (notice.kind) {
      case "timed-out": {
        this.#counters.queueTimeouts += 1;
        const lane = this.#queue.state?.config.lanes[notice.item.lane];
        if (caller === undefined) return;
        this.#callers.fail(caller, "queue_timeout", "The request waited too long for capacity.", {
          status: lane?.refuseStatus ?? 503,
          retry_after_ms: notice.retryAfterMs,
        });
        return;
      }
      case "too-large":
        if (caller === undefined) return;
        this.#callers.fail(
          caller,
          "prompt_too_large",
          "The prompt exceeds every origin's KV cache.",
        );
        return;
      case "overdue":
        // A `wait` lane keeps it queued; the caller's own deadline still applies at the edge.
        return;
      default:
        assertNever(notice);
    }
  }

  #busy(): boolean {
    return this.#calls.size > 0 || this.#queue.queued() > 0;
  }

  #armAlarm(): void {
    if (this.#alarmArmed) return;
    this.#alarmArmed = true;
    this.ctx.waitUntil(this.ctx.storage.setAlarm(Date.now() + ALARM_BACKSTOP_MS));
  }

  async #cancelOrphans(): Promise<void> {
    const orphans = this.#records.orphans((id) => this.#calls.has(id));
    await Promise.all(
      orphans.map(async (row) => {
        // Without ids the origin cancels every unfinished item of the call.
        const links = this.#links.credentialed(this.#queue.setup, row.origin_id, row.origin_url);
        const origin = currentUpstream(links);
        const ok = await cancelBatchItems(origin, row.batch_id);
        if (!ok)
          logWarn("orphaned batch cancel failed", { batch: row.batch_id, origin: row.origin_id });
        this.#counters.orphansCancelled += 1;
        this.#records.remove(row.batch_id);
      }),
    );
  }
}
