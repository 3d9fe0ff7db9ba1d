/**
 * Outcome lookups gathered by origin (docs/edge.md, "Delivery"): a request whose answer
 * ended without an END (a piped stream, above all) asks its origin what it generated, and
 * the asks of one origin that come within {@link ASK_GATHER_MS} of each other go in one
 * lookup. Each request waits on timers of its own and reads what a lookup found from the
 * isolate's memory: no promise is resolved across requests.
 */
import {
  type FoundItem,
  OUTCOME_LOOKUP_TIMEOUT_MS,
  type OutcomeLookup,
  type OutcomeLookupResult,
  type OutcomeSource,
  joinAnswers,
  lookupOutcomes,
} from "../../contracts/outcomes.ts";
import { MAX_OUTCOME_IDS, requestIdOf } from "../../contracts/protocol/schema.ts";
import { sleep } from "../../contracts/sleep.ts";

/**
 * How long an ask waits for others of its origin to go in the same lookup, and between
 * looks at a lookup another request sent with it. The answer it waits for settles a request
 * whose client has its whole body already; its settlement then waits longer still.
 */
export const ASK_GATHER_MS = 20;

type AskState =
  | { kind: "queued" }
  // In a lookup another request sent.
  | { kind: "sent" }
  | { kind: "answered"; items: FoundItem[] }
  // The origin did not answer.
  | { kind: "silent" };

interface Ask {
  ids: readonly string[];
  state: AskState;
}

/** One isolate's asks, by origin; {@link OutcomeAsks.lookup} is the way to ask. */
export class OutcomeAsks {
  readonly #queued = new Map<string, Set<Ask>>();
  readonly #send: OutcomeLookup;

  /** `send` makes each lookup (the origins' `POST /v1/batch/outcomes`). */
  constructor(send: OutcomeLookup = lookupOutcomes) {
    this.#send = send;
  }

  /**
   * An {@link OutcomeLookup} whose asks by request id are gathered by origin; one with
   * prefixes goes alone.
   */
  readonly lookup: OutcomeLookup = async (
    sources,
    query,
    secrets,
    timeoutMs = OUTCOME_LOOKUP_TIMEOUT_MS,
  ) => {
    if ((query.prefixes?.length ?? 0) > 0 || query.ids.length === 0) {
      return this.#send(sources, query, secrets, timeoutMs);
    }
    const answers = await Promise.all(
      sources.map((source) => this.#ask(source, query.ids, secrets, timeoutMs)),
    );
    return joinAnswers(sources, answers);
  };

  /** Asks waiting for a lookup to carry them (for tests and diagnostics). */
  get pending(): number {
    let count = 0;
    for (const queue of this.#queued.values()) count += queue.size;
    return count;
  }

  // What `source` remembers of the requests `ids`; null when it did not answer.
  async #ask(
    source: OutcomeSource,
    ids: readonly string[],
    secrets: object,
    timeoutMs: number,
  ): Promise<FoundItem[] | null> {
    const key = `${source.id} ${source.url}`;
    const ask: Ask = { ids, state: { kind: "queued" } };
    let queue = this.#queued.get(key);
    if (queue === undefined) this.#queued.set(key, (queue = new Set()));
    queue.add(ask);
    // A lookup that carries it and never answers (its request's context ended) is waited for
    // this long, then it asks alone.
    const giveUpAt = Date.now() + timeoutMs + ASK_GATHER_MS;
    if (queue.size < MAX_OUTCOME_IDS) await sleep(ASK_GATHER_MS);
    for (;;) {
      const { state } = ask;
      switch (state.kind) {
        case "answered":
          return state.items;
        case "silent":
          return null;
        case "queued":
          await this.#sendQueued(key, source, secrets, timeoutMs);
          continue;
        case "sent":
          if (Date.now() < giveUpAt) {
            await sleep(ASK_GATHER_MS);
            continue;
          }
          await this.#answer([ask], source, secrets, timeoutMs);
          continue;
      }
    }
  }

  // Sends the asks of `key` waiting now (as many as one lookup takes) in one lookup.
  async #sendQueued(key: string, source: OutcomeSource, secrets: object, timeoutMs: number) {
    const queue = this.#queued.get(key);
    if (queue === undefined) return;
    const taken: Ask[] = [];
    let ids = 0;
    for (const ask of queue) {
      if (ids + ask.ids.length > MAX_OUTCOME_IDS && taken.length > 0) break;
      taken.push(ask);
      ids += ask.ids.length;
    }
    for (const ask of taken) {
      ask.state = { kind: "sent" };
      queue.delete(ask);
    }
    if (queue.size === 0) this.#queued.delete(key);
    await this.#answer(taken, source, secrets, timeoutMs);
  }

  // Looks up `asks` at `source` and sets each one's answer.
  async #answer(asks: readonly Ask[], source: OutcomeSource, secrets: object, timeoutMs: number) {
    const ids = [...new Set(asks.flatMap((ask) => ask.ids))];
    let found: OutcomeLookupResult | null = null;
    try {
      found = await this.#send([source], { ids }, secrets, timeoutMs);
    } catch {
      // A lookup that failed is an origin that did not answer.
    }
    if (found === null || !found.complete) {
      for (const ask of asks) ask.state = { kind: "silent" };
      return;
    }
    // Each ask reads its own requests' items.
    const byRequest = new Map<string, FoundItem[]>();
    for (const item of found.items) {
      const requestId = requestIdOf(item.id);
      const items = byRequest.get(requestId);
      if (items === undefined) byRequest.set(requestId, [item]);
      else items.push(item);
    }
    for (const ask of asks) {
      const items = [...new Set(ask.ids)].flatMap((id) => byRequest.get(id) ?? []);
      ask.state = { kind: "answered", items };
    }
  }
}
