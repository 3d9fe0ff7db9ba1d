/**
 * Batcher: one Durable Object per region, model, shard and settings version
 * (docs/batching.md). Requests gather in priority lanes and leave as batches over the
 * origin batch protocol, one upstream call per flush and origin; each caller gets its own
 * item back. RPC: `answer` (a JSON item, answered whole at its END), `open` and `end` (a
 * streamed item: its HEAD with a body stream, then its END), `cancel`, `snapshot`. The
 * policy is the pure core in `window/`; the live window, callers (`callers/`) and upstream
 * calls (`upstream/`) are built below in the order they depend on each other; a shard
 * reports its load to its region and model's `BatcherShards` (`shard-reporter.ts`).
 */
import { DurableObject } from "cloudflare:workers";
import type { DeliveryMode } from "../../contracts/delivery.ts";
import { Callers } from "./callers/callers.ts";
import { BODY_BUFFER_BYTES, ClientBody } from "./callers/client-body.ts";
import { AnswerSink, type CallerSink, WholeSink } from "./callers/sinks.ts";
import { newCounters } from "./counters.ts";
import { KeepAlive } from "./keep-alive.ts";
import { LiveWindow } from "./live-window.ts";
import { CallRecords } from "./records.ts";
import { Placer } from "./routing/placer.ts";
import { ShardReporter } from "./shard-reporter.ts";
import { snapshotOf } from "./snapshot.ts";
import {
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
import type { BatcherSetup } from "../../contracts/config/plans.ts";
import { RegionBreakers } from "./upstream/breakers.ts";
import { Calls } from "./upstream/calls.ts";
import { OriginCredentials } from "./upstream/credentials.ts";
import { Orphans } from "./upstream/orphans.ts";
import { ItemStopper } from "./upstream/stop.ts";
import { enqueue } from "./window/flush.ts";
import { assertNever } from "./window/state.ts";
import { allowedCandidates, healthyCandidates, recordFirstByteWait } from "./window/terms.ts";

/** Micro-batching window, lanes and demultiplexing for one region, model and shard. */
export class Batcher extends DurableObject<Env> {
  // Each part is built from those above it only.
  readonly #counters = newCounters();
  readonly #keepAlive = new KeepAlive(this.ctx);
  readonly #records = new CallRecords(this.ctx.storage);
  readonly #placer = new Placer(this.ctx.storage);
  readonly #credentials = new OriginCredentials(this.env);
  readonly #breakers = new RegionBreakers(this.env, this.#keepAlive);
  readonly #window = new LiveWindow();
  readonly #stopper = new ItemStopper(this.#window, this.#credentials, this.#keepAlive);
  readonly #callers = new Callers(this.#window, this.#counters, this.#stopper);
  readonly #calls = new Calls({
    window: this.#window,
    callers: this.#callers,
    stopper: this.#stopper,
    credentials: this.#credentials,
    breakers: this.#breakers,
    records: this.#records,
    counters: this.#counters,
    keepAlive: this.#keepAlive,
  });
  readonly #shards = new ShardReporter(this.env, this.#keepAlive, this.#window);
  readonly #orphans = new Orphans(this.#records, this.#credentials, this.#window, this.#counters);
  /** Items `open` opened whose END `end` has not asked for yet. */
  readonly #answers = new Map<string, AnswerSink>();

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    // The one edge back up: the breakers' changes reach the calls built on them.
    this.#breakers.listen((changed) => this.#calls.breakersChanged(changed, Date.now()));
    void ctx.blockConcurrencyWhile(async () => {
      // Every row left from before this incarnation is a call an origin may still run.
      if (this.#records.migrate() > 0) await this.#keepAlive.alarmNow();
    });
  }

  /**
   * Admits one request attempt whose client gets its answer whole (JSON), and answers once
   * its item ended, with its HEAD, body and END in one answer; or at once with a refusal. A
   * caller that goes away cancels its item with `cancel` (with `untilEnd`, the END still
   * brings the usage generated until then).
   */
  async answer(input: BatcherAttempt): Promise<BatcherAnswerResult> {
    const setup = input.setup ?? this.#window.setup;
    if (setup === null) return { kind: "setup_needed" };
    const sink = new WholeSink();
    const admitted = await this.#admit(input, setup, "whole", sink, null);
    if (admitted.kind !== "accepted") return admitted;
    const whole = await sink.done;
    return {
      kind: "answered",
      head: whole.head as BatcherHead | null,
      headMs: whole.headMs,
      body: whole.body,
      trailer: whole.trailer,
      atOnce: admitted.atOnce,
      ...this.#shards.heard,
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
    const setup = input.setup ?? this.#window.setup;
    if (setup === null) return { kind: "setup_needed" };
    const sink = new AnswerSink();
    // Should this object go away, the runtime errors a stream returned over RPC, so the
    // client is never left waiting on a body nobody writes.
    const { readable, writable } = new IdentityTransformStream({
      highWaterMark: BODY_BUFFER_BYTES,
    });
    const body = new ClientBody(writable, setup.clientBacklogBytes);
    // Known before admission may wait (a breaker refresh): `end` may come meanwhile.
    this.#answers.set(input.id, sink);
    const admitted = await this.#admit(input, setup, "stream", sink, body);
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
          ...this.#shards.heard,
        };
      case "ended":
        this.#answers.delete(input.id);
        return {
          kind: "ended",
          trailer: failureTrailerOf(input.id, opening.trailer),
          atOnce: admitted.atOnce,
          ...this.#shards.heard,
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
    return snapshotOf(this.#window, this.#calls, this.#records.count(), this.#counters);
  }

  /** Backstop: flushes what is due, cancels orphaned calls, and re-arms while work remains. */
  override async alarm(): Promise<void> {
    this.#keepAlive.alarmRan();
    this.#calls.flushIfQueued(Date.now());
    await this.#orphans.cancel((id) => this.#calls.has(id));
    if (this.#busy()) this.#keepAlive.armAlarm();
  }

  /**
   * Admission shared by `answer` and `open`. A refusal for want of a healthy origin may rest
   * on a stale copy of the breakers: it is refreshed and the request admitted again.
   */
  async #admit(
    input: BatcherAttempt,
    setup: BatcherSetup,
    delivery: DeliveryMode,
    sink: CallerSink,
    body: ClientBody | null,
  ) {
    const admitted = this.#enqueue(input, setup, delivery, sink, body);
    if (admitted.kind !== "failed" || admitted.code !== "no_healthy_origin") return admitted;
    if (!(await this.#breakers.refresh(setup))) return admitted;
    // Counted once: the second try stands for the first.
    this.#counters.submitted -= 1;
    this.#counters.refusedOther -= 1;
    return this.#enqueue(input, setup, delivery, sink, body);
  }

  #enqueue(
    input: BatcherAttempt,
    setup: BatcherSetup,
    delivery: DeliveryMode,
    sink: CallerSink,
    body: ClientBody | null,
  ): BatcherNotAdmitted | { kind: "accepted"; atOnce: boolean } {
    const now = Date.now();
    this.#shards.note(input.shard, now);
    let state = this.#window.configure(setup, now, this.#busy(), this.#breakers.cache);
    this.#breakers.sync(setup, now);
    if (input.recentFirstByteMs !== undefined && input.recentFirstByteMs !== null) {
      state = recordFirstByteWait(state, input.recentFirstByteMs, now);
      this.#window.replace(state);
    }
    this.#counters.submitted += 1;
    const avoid = input.avoidOrigins;
    const usable = this.#window.options.usable;
    const allowed = allowedCandidates(healthyCandidates(state, now, usable), input);
    if (allowed.length === 0) {
      this.#counters.refusedOther += 1;
      return { kind: "failed", code: "no_healthy_origin", detail: "no healthy origin to try" };
    }
    const health = this.#window.health;
    const target = this.#placer.place(this.#window.router, input, allowed, (id) =>
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
    const { state: next, decision } = enqueue(state, request, now, this.#window.options);
    switch (decision.kind) {
      case "rejected":
        this.#window.router?.forget(input.id);
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
        this.#window.replace(next);
        this.#callers.admit(input, delivery, sink, body);
        this.#counters.dispatchedAtOnce += 1;
        this.#calls.send(decision.batch, now);
        return { kind: "accepted", atOnce: true };
      case "queued":
        this.#window.replace(next);
        this.#callers.admit(input, delivery, sink, body);
        this.#counters.queued += 1;
        if (decision.flushAt <= now) this.#calls.flush(now);
        else this.#calls.schedule(decision.flushAt);
        this.#keepAlive.armAlarm();
        return { kind: "accepted", atOnce: false };
      default:
        return assertNever(decision);
    }
  }

  #busy(): boolean {
    return this.#calls.size > 0 || this.#window.queued() > 0;
  }
}
