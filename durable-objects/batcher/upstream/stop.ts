/**
 * Stopping a running item on its origin (docs/batching.md, "Upstream calls"): by closing
 * its call when nothing else in it is still wanted (the origin cancels every unfinished item
 * of a dropped call, and a request is saved), else with the origin's cancel endpoint.
 */
import { logWarn } from "../../../contracts/log.ts";
import { cancelBatchItems, currentUpstream } from "../../../contracts/upstream.ts";
import type { BatchCaller, OpenCall } from "../callers/caller.ts";
import type { KeepAlive } from "../keep-alive.ts";
import type { LiveWindow } from "../live-window.ts";
import { cancel as cancelInWindow } from "../window/events.ts";
import type { OriginCredentials } from "./credentials.ts";

/** Stops items that left the queue, on the origins running them. */
export class ItemStopper {
  readonly #window: LiveWindow;
  readonly #credentials: OriginCredentials;
  readonly #keepAlive: KeepAlive;

  constructor(window: LiveWindow, credentials: OriginCredentials, keepAlive: KeepAlive) {
    this.#window = window;
    this.#credentials = credentials;
    this.#keepAlive = keepAlive;
  }

  /**
   * Stops `caller`'s item in `call`: by closing the call where `mayCloseCall` and nothing
   * else in it is wanted, else by asking its origin unless `askOrigin` is false (it was
   * asked already: a cancel until END that the caller then stopped waiting for).
   */
  stop(caller: BatchCaller, call: OpenCall, mayCloseCall: boolean, askOrigin: boolean): void {
    const now = Date.now();
    this.#window.update((s) => cancelInWindow(s, caller.input.id, now).state);
    const wanted = call.callers.some(
      (other, index) => other !== caller && !call.done.has(index) && other.stage !== "ended",
    );
    if (mayCloseCall && !wanted) {
      call.abortReason = "all-cancelled";
      call.abort.abort("every item was cancelled");
      return;
    }
    if (!askOrigin) return;
    const origin = this.#credentials.credentialed(this.#window.setup, call.originId, call.url);
    this.#keepAlive.waitUntil(
      cancelBatchItems(currentUpstream(origin), call.id, [caller.input.id]).then((ok) => {
        if (!ok) {
          logWarn("origin cancel failed", {
            batch: call.id,
            origin: call.originId,
            request_id: caller.input.id,
          });
        }
      }),
    );
  }
}
