/**
 * The window as the Batcher runs it (docs/batching.md, "The window"): the setup it runs
 * under, the window policy's state, and what that setup builds to choose origins: the
 * origins' health, which ranks them by the quarantine rule of `contracts/origin-health.ts`,
 * and the router. Flushing it on time is the upstream calls' (`upstream/calls.ts`).
 */
import type { BreakerView } from "../../contracts/breaker.ts";
import { type BreakerGate, OriginHealth } from "../../contracts/origin-health.ts";
import { Router } from "./routing/router.ts";
import type { BatcherSetup } from "../../contracts/config/plans.ts";
import { tick as tickWindow } from "./window/flush.ts";
import { chooseLeastLoadedInTurn, fitsKv } from "./window/origin-choice.ts";
import { createWindowState, queuedCount } from "./window/state.ts";
import type { TickResult, WindowOptions, WindowState } from "./window/types.ts";

/** The window's state under the current setup, with the origins' health and router built for it. */
export class LiveWindow {
  #setup: BatcherSetup | null = null;
  #state: WindowState | null = null;
  #health = new OriginHealth();
  #router: Router | null = null;
  readonly #lastSentAt = new Map<string, number>();
  readonly #inTurn = chooseLeastLoadedInTurn((id) => this.#lastSentAt.get(id) ?? null);
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
   * Of the breakers that changed, the origins they now block: one behind an open or half-open
   * breaker takes nothing from the window until it closes (the health rule says so). Null
   * where this setup's breakers are off: their changes mean nothing here.
   */
  blockedBy(changed: readonly BreakerView[]): string[] | null {
    if (this.#setup?.breakers.enabled !== true) return null;
    return changed.filter((view) => view.state !== "closed").map((v) => v.origin);
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

  /**
   * Applies the window's timeouts and takes out every batch that is due (see `tick`); null
   * before the first setup.
   */
  tick(now: number): TickResult | null {
    if (this.#state === null) return null;
    const result = tickWindow(this.#state, now, this.options);
    this.#state = result.state;
    return result;
  }
}
