/**
 * Placing an admitted attempt with the Batcher's router (docs/routing.md): on an origin
 * among those it may go to, with the router's index read from storage first and stored
 * behind after each change.
 */
import type { BatcherAttempt } from "../types.ts";
import type { OriginCandidate } from "../window/origin-choice.ts";
import { IndexStore } from "./index-store.ts";
import type { RouteCandidate } from "./placement.ts";
import type { Router } from "./router.ts";

/** Places attempts with the window's router and keeps its index stored. */
export class Placer {
  readonly #store: IndexStore;

  constructor(storage: DurableObjectStorage) {
    this.#store = new IndexStore(storage);
  }

  /**
   * The origin `input` is placed on among `allowed`, leaving out those `quarantined` (they
   * failed lately: their warm blocks are no reason to send them traffic) unless no other
   * is left; undefined where routing is off.
   */
  place(
    router: Router | null,
    input: BatcherAttempt,
    allowed: readonly OriginCandidate[],
    quarantined: (origin: string) => boolean,
  ): string | undefined {
    if (router === null || input.route === undefined || allowed.length === 0) return undefined;
    const healthy = allowed.filter((c) => !quarantined(c.id));
    const candidates = healthy.length > 0 ? healthy : allowed;
    this.#store.attach(router);
    const { blocks, session, pinned } = input.route;
    const request = { id: input.id, blocks, promptTokens: input.promptTokens, session, pinned };
    const choice = router.place(
      request,
      candidates.map((c) => routeCandidate(c, router)),
      Date.now(),
    );
    this.#store.changed();
    return choice.origin;
  }
}

/**
 * A window candidate as the router sees it. Its prefill backlog is what the origin last
 * reported, which every Batcher sees alike, plus what this one placed since.
 */
function routeCandidate(c: OriginCandidate, router: Router): RouteCandidate {
  const reported = c.engine?.prefillBacklogTokens ?? null;
  const backlogTokens = router.backlogTokens(
    c.id,
    reported === null || c.engine === undefined
      ? null
      : { tokens: reported, at: c.engine.reportedAt },
  );
  return {
    id: c.id,
    load: c.load,
    maxNumSeqs: c.engine?.maxNumSeqs ?? null,
    stepMs: c.engine?.stepMs ?? 0,
    prefillTokensPerMs: c.engine?.prefillTokensPerMs ?? null,
    backlogTokens,
    kvRoomTokens: c.kvRoomTokens,
  };
}
