/**
 * The Batcher's lanes over time (docs/batching.md, "The window"): the window policy's state,
 * the one timer that flushes it, and the origin choice it uses, which ranks origins by the
 * quarantine rule of `contracts/origin-health.ts`. Flushed batches and the notices of items
 * that leave a lane otherwise go to the handlers given at construction.
 */
import type { BreakerView } from "../../contracts/breaker.ts";
import { type BreakerGate, OriginHealth } from "../../contracts/origin-health.ts";
import { chooseLeastLoadedInTurn, fitsKv } from "./origin-choice.ts";
import { Router } from "./routing/router.ts";
import type { BatcherSetup } from "../../contracts/config/plans.ts";
import {
  type Batch,
  type TickNotice,
  type WindowOptions,
  type WindowState,
  createWindowState,
  queuedCount,
  tick,
} from "./window/index.ts";

/** Where a flush's results go. */
export interface QueueHandlers {
  send(batch: Batch, now: number): void;
  notice(notice: TickNotice): void;
}

/** The window's state and timer, and the origins' health as this Batcher sees it. */
export class Queue {
  #setup: BatcherSetup | null = null;
  #state: WindowState | null = null;
  #health = new OriginHealth();
  #router: Router | null = null;
  readonly #lastSentAt = new Map<string, number>();
  readonly #inTurn = chooseLeastLoadedInTurn((id) => this.#lastSentAt.get(id) ?? null);
  readonly #handlers: QueueHandlers;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #timerAt: number | null = null;
  readonly options: WindowOptions = {
    // The router's origin while it is up and can hold the head; else healthy origins
    // first, and a quarantined one only when no healthy one can take the batch.
    // The window asks the health rule which origins may take requests; it keeps none.
    usable: (id) => this.#health.usable(id),
    chooseOrigin: (candidates, head) => {
      const { target } = head;
      const now = Date.now();
      if (target !== undefined && !this.#health.quarantined(target, now)) {
        const placed = candidates.find((c) => c.id === target);
        if (placed !== undefined && fitsKv(placed, head.promptTokens)) return target;
      }
      const healthy = candidates.filter((c) => !this.#health.quarantined(c.id, now));
      const origin = this.#inTurn(healthy, head) ?? this.#inTurn(candidates, head);
      if (target !== undefined && origin !== null) this.#router?.moved(head.id, origin, now);
      return origin;
    },
  };

  constructor(handlers: QueueHandlers) {
    this.#handlers = handlers;
  }

  get setup(): BatcherSetup | null {
    return this.#setup;
  }

  get state(): WindowState | null {
    return this.#state;
  }

  get health(): OriginHealth {
    return this.#health;
  }

  /** The router of the current setup; null where routing is off. */
  get router(): Router | null {
    return this.#router;
  }

  /**
   * The state for `setup`, which replaces the one in use unless that is the same version or
   * still has work (`busy`): a name's setup never changes.
   */
  configure(setup: BatcherSetup, now: number, busy: boolean, breakers: BreakerGate): WindowState {
    if (this.#state !== null && this.#setup !== null) {
      if (this.#setup.version === setup.version || busy) return this.#state;
    }
    this.#setup = setup;
    this.#state = createWindowState(setup.window, now);
    this.#health = new OriginHealth(
      setup.quarantineMs,
      setup.breakers.enabled ? breakers : undefined,
    );
    this.#lastSentAt.clear();
    this.#router =
      setup.routing === null
        ? null
        : new Router(
            setup.origins.map((origin) => origin.id),
            setup.routing,
          );
    return this.#state;
  }

  /**
   * Breakers that changed: an origin behind an open or half-open breaker takes nothing
   * from the window until it closes (the health rule says so), and one that closed may
   * take what waits. Answers the origins that became blocked.
   */
  breakersChanged(changed: readonly BreakerView[], now: number): string[] {
    if (this.#setup?.breakers.enabled !== true) return [];
    const blocked = changed.filter((view) => view.state !== "closed").map((v) => v.origin);
    this.flushIfQueued(now);
    return blocked;
  }

  /** Replaces the state with `step` of it (nothing before the first setup). */
  update(step: (state: WindowState) => WindowState): void {
    if (this.#state !== null) this.#state = step(this.#state);
  }

  replace(state: WindowState): void {
    this.#state = state;
  }

  queued(): number {
    return this.#state === null ? 0 : queuedCount(this.#state);
  }

  /** A batch left for `originId`. */
  sent(originId: string, now: number): void {
    this.#lastSentAt.set(originId, now);
  }

  /** Sends what is due, tells of items that left otherwise, and sets the timer for the next. */
  flush(now: number): void {
    if (this.#state === null) return;
    const result = tick(this.#state, now, this.options);
    this.#state = result.state;
    for (const notice of result.notices) this.#handlers.notice(notice);
    for (const batch of result.batches) this.#handlers.send(batch, now);
    if (result.nextWakeAt !== null) this.schedule(result.nextWakeAt);
  }

  /** Flushes when anything waits: room was freed. */
  flushIfQueued(now: number): void {
    if (this.queued() > 0) this.flush(now);
  }

  /** Flushes at `at` unless a flush is due sooner. */
  schedule(at: number): void {
    if (this.#timerAt !== null && this.#timerAt <= at) return;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timerAt = at;
    // A timer, not an alarm: windows are milliseconds and alarms are too coarse for them.
    this.#timer = setTimeout(
      () => {
        this.#timer = null;
        this.#timerAt = null;
        this.flush(Date.now());
      },
      Math.max(0, at - Date.now()),
    );
  }
}
