/**
 * The per-request completion hook. Every request is settled exactly once, whether it
 * ended in success, an origin or edge error, a client cancel or a timeout; metering,
 * limit release and the ledger register hooks with {@link Settlement.onSettled}.
 * See docs/edge.md, "Settlement".
 */
import { logError } from "../../contracts/log.ts";
import type { ItemOutcome, ItemUsage } from "../../contracts/protocol/schema.ts";
import type { RequestAttempt } from "../../durable-objects/key-account/types.ts";
import type { OriginConfig } from "../../contracts/config/regions.ts";

/** An attempt the edge gave up on after sending it to an origin, which may have run it. */
export interface GivenUp {
  region: string;
  origin: OriginConfig;
  itemId: string;
  /** Its call could not reach the origin at all (the connection failed, not given up on). */
  unreachable?: true;
}

/** How a request ended: the origin protocol's outcomes, seen from the client. */
export type RequestOutcome = ItemOutcome;

/** What a settled request reports to its hooks. */
export interface SettledRequest {
  requestId: string;
  /** The resolved model id, or null when the request failed before one was chosen. */
  model: string | null;
  outcome: RequestOutcome;
  /**
   * What its origin generated: from the item's END, or, when none reached the edge, from the
   * origin's outcome record; null when nothing was generated.
   */
  usage: ItemUsage | null;
  /**
   * No END came and its origins could not say yet what it generated (an item would not end,
   * or an origin that took it did not answer): its key's account asks the origins again.
   */
  usageUnknown?: boolean;
  /** Region and origin that served it, or null when none did. */
  region: string | null;
  origin: string | null;
  /** The HTTP status the client received. */
  status: number;
  /**
   * Whether an origin began answering it (a HEAD below 400). Without usage, one that did may
   * have generated tokens; one that did not generated none, so its tokens are given back.
   */
  originBegan: boolean;
  /** The engine's time to first token, from the item's END, when it reported one. */
  ttftMs?: number | null;
  /** When a streamed answer's first body bytes went to the client (epoch ms). */
  firstByteAt?: number | null;
}

/** Runs when a request is settled; may be async (it runs under `waitUntil`). */
export type SettleHook = (settled: SettledRequest) => void | Promise<void>;

/** Collects hooks and runs them once, off the response path, under `waitUntil`. */
export class Settlement {
  #requestId: string;
  /** When the edge received the request (epoch ms). */
  readonly startedAt = Date.now();
  /** Every attempt at serving it so far, in order (see `delivery/failover.ts`). */
  readonly attempts: RequestAttempt[] = [];
  /** Attempts given up on after reaching an origin, which may have generated tokens. */
  readonly gaveUp: GivenUp[] = [];
  #unserved: ((record: SettledRequest) => Promise<SettledRequest>) | null = null;
  #hooks: SettleHook[] = [];
  #releaseHooks: SettleHook[] = [];
  #released = false;
  #record: SettledRequest | null = null;
  #recordWaiters: ((record: SettledRequest) => void)[] = [];
  #settled = false;
  #held = false;
  #release: () => void = () => {};
  #waitUntil: (promise: Promise<unknown>) => void;

  constructor(requestId: string, waitUntil: (promise: Promise<unknown>) => void) {
    this.#requestId = requestId;
    this.#waitUntil = waitUntil;
  }

  /** The request's id (`x-request-id`). */
  get requestId(): string {
    return this.#requestId;
  }

  /** Names the request as its admission did (a lease names its requests), before it is sent. */
  rename(requestId: string): void {
    this.#requestId = requestId;
  }

  /** Whether the request has been settled. */
  get settled(): boolean {
    return this.#settled;
  }

  /** What the request was settled with, once it has been (set before any hook runs). */
  get record(): SettledRequest | null {
    return this.#record;
  }

  /**
   * The request's record as soon as it is known, before any hook runs (a hook may wait on
   * its key's account first): for what must follow the settlement closely.
   */
  whenRecorded(): Promise<SettledRequest> {
    if (this.#record !== null) return Promise.resolve(this.#record);
    return new Promise((resolve) => this.#recordWaiters.push(resolve));
  }

  /** Whether a streamed response holds the context until it settles (see {@link hold}). */
  get held(): boolean {
    return this.#held;
  }

  /**
   * How a request that ends with no origin serving it learns what the attempts it gave up on
   * generated (see `delivery/generated.ts`): asked before its hooks run, only then.
   */
  onUnserved(fill: (record: SettledRequest) => Promise<SettledRequest>): void {
    this.#unserved = fill;
  }

  /** Registers a hook; hooks run in registration order. */
  onSettled(hook: SettleHook): void {
    this.#hooks.push(hook);
  }

  /** Registers a hook run by {@link release}. */
  onReleased(hook: SettleHook): void {
    this.#releaseHooks.push(hook);
  }

  /**
   * The request's work ended before what it generated is known (its client went away):
   * runs the release hooks once, unless it is settled already; {@link settle} follows.
   */
  release(released: Omit<SettledRequest, "requestId">): void {
    if (this.#released || this.#settled) return;
    this.#released = true;
    const record: SettledRequest = { requestId: this.#requestId, ...released };
    const hooks = this.#releaseHooks;
    this.#waitUntil(
      (async () => {
        for (const hook of hooks) {
          try {
            await hook(record);
          } catch (error) {
            logError("release hook failed", { request_id: record.requestId, error });
          }
        }
      })(),
    );
  }

  /**
   * Keeps the request's context alive until {@link settle} has run its hooks: a streamed
   * response settles after the handler returned, possibly from a stream's cancel callback.
   */
  hold(): void {
    if (this.#held || this.#settled) return;
    this.#held = true;
    this.#waitUntil(
      new Promise<void>((resolve) => {
        this.#release = resolve;
      }),
    );
  }

  /** Settles the request; later calls are ignored, so every ending path may call it. */
  settle(settled: Omit<SettledRequest, "requestId">): void {
    if (this.#settled) return;
    this.#settled = true;
    const record: SettledRequest = { requestId: this.#requestId, ...settled };
    const fill = record.origin === null && this.gaveUp.length > 0 ? this.#unserved : null;
    // Known now, unless its origins are to be asked first.
    if (fill === null) this.#recorded(record);
    const filled = fill === null ? Promise.resolve(record) : fill(record).catch(() => record);
    const run = filled
      .then((full) => {
        this.#recorded(full);
        return this.#run(full);
      })
      .finally(() => this.#release());
    // When held, the held promise resolves after `run`, so the context outlives the hooks.
    if (!this.#held) this.#waitUntil(run);
  }

  #recorded(record: SettledRequest): void {
    this.#record = record;
    const waiters = this.#recordWaiters;
    this.#recordWaiters = [];
    for (const resolve of waiters) resolve(record);
  }

  async #run(record: SettledRequest): Promise<void> {
    for (const hook of this.#hooks) {
      try {
        await hook(record);
      } catch (error) {
        // A failing hook must not stop the others (each settles its own concern).
        logError("settle hook failed", { request_id: record.requestId, error });
      }
    }
  }
}
