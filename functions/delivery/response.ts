/**
 * One response lifecycle for an opened item (docs/edge.md, "Delivery"): one
 * deadline, one finish and one settlement, with two body strategies. A streamed answer's
 * body goes to the client as it comes, and a failure after its HEAD ends it with OpenAI's
 * error event (a Responses stream's typed `error` and `response.failed`); a whole (JSON) answer is read first, so a failure inside it answers 502/504.
 */
import { logWarn } from "../../contracts/log.ts";
import type { OutcomeLookup } from "../../contracts/outcomes.ts";
import { originFailure } from "../../contracts/errors.ts";
import type { ItemTrailer } from "../../contracts/protocol/schema.ts";
import { type DeliveryMode, answerDelivery } from "../../contracts/delivery.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import { responsesFailureEnding } from "../../contracts/responses-failure.ts";
import type { OriginPool, RegionOrigin } from "./origin-pool.ts";
import type { GivenUp, SettledRequest } from "../accounts/settlement.ts";
import type { RequestAttempt } from "../../durable-objects/key-account/types.ts";
import {
  END_WAIT_MS,
  ORIGIN_ASK,
  billed,
  generatedBy,
  originsNamed,
  servedOrGivenUp,
} from "./generated.ts";
import type { ItemEnd, OpenItem } from "./item.ts";

/** Where the item is served. */
export interface Served {
  region: string;
  origin: string;
}

type Outcome = SettledRequest["outcome"];

/** A whole answer as read before the client gets anything. */
export interface WholeRead {
  body: Uint8Array;
  end: ItemEnd;
  /** The request's time ran out while it was read (the item was stopped). */
  timedOut: boolean;
  /** Its END came and says it is whole (see {@link endOutcome}). */
  complete: boolean;
}

/** What the response lifecycle needs of the request it answers. */
export interface AnswerOptions {
  requestId: string;
  /** The resolved model id. */
  model: string;
  /** The request's candidates (where its origins' outcome records are asked). */
  candidates: readonly RegionOrigin[];
  pool: OriginPool;
  /** How the client gets its answer (the plan's decision). */
  delivery: DeliveryMode;
  /** The route it was sent to: a Responses stream that fails ends with its typed events. */
  path?: ItemPath;
  /** Where the origins' credentials are (the Worker's secrets). */
  secrets: object;
  /** Called exactly once when the request ends, however it ends. */
  onSettled: (settled: Omit<SettledRequest, "requestId">) => void;
  /**
   * Called at once, before `onSettled`, when a streamed answer's client went away while
   * what its origin generated is not known yet: its slot and reservation come back now.
   */
  onReleased?: (released: Omit<SettledRequest, "requestId">) => void;
  /** Aborts when the client disconnects (Workers' `request.signal`). */
  signal?: AbortSignal;
  /** Where each attempt is listed, for the request's usage record. */
  attempts?: RequestAttempt[];
  /**
   * The edge's headers every answer to the request carries (its key's `x-ratelimit-*`),
   * lower-case, in place of any the engine sent: set as the answer is made, not after.
   */
  answerHeaders?: readonly (readonly [string, string])[];
  /** How long a stream whose client went away waits for its END (default `END_WAIT_MS`). */
  endWaitMs?: number;
  /** How an answer that ended without an END asks its origin (the isolate's `OutcomeAsks`). */
  lookup?: OutcomeLookup;
}

/** Whether `item`'s answer is streamed to the client or read whole first. */
export function streams(item: OpenItem, options: AnswerOptions): boolean {
  return answerDelivery(options.delivery, item.head.headers) === "stream";
}

/** Reads `item`'s whole answer, giving up after `timeoutMs`. */
export async function readWhole(item: OpenItem, timeoutMs: number): Promise<WholeRead> {
  let timedOut = false;
  const timer = setTimeout(
    () => {
      timedOut = true;
      item.cancel();
    },
    Math.max(0, timeoutMs),
  );
  try {
    const { body, end } = await item.whole();
    const complete =
      end.kind === "closed" ||
      (end.kind === "end" && endOutcome(end.trailer, item.head.status).complete);
    return { body, end, timedOut, complete };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The client's response for `item`: streamed, or from its whole answer already `read` (once
 * settled); a whole answer that failed rejects with its ApiError. `gaveUp`: the request's
 * attempts given up on before this one, billed instead should one of them outrank it.
 */
export async function respond(
  item: OpenItem,
  served: Served,
  options: AnswerOptions,
  read: WholeRead | null,
  deadline: number,
  gaveUp: readonly GivenUp[],
  onEnd?: (verdict: "ok" | "failed") => void,
): Promise<Response> {
  const life = new Lifecycle(item, served, options, deadline, gaveUp, onEnd);
  return read === null ? life.stream() : life.whole(read);
}

class Lifecycle {
  readonly #item: OpenItem;
  readonly #served: Served;
  readonly #options: AnswerOptions;
  readonly #gaveUp: readonly GivenUp[];
  #finished = false;
  readonly #deadline: ReturnType<typeof setTimeout>;
  #onTimeout: () => void = () => {};
  /** Told how a stream ended for its origin's breaker: whole (or left by its client), or cut. */
  readonly #onEnd: ((verdict: "ok" | "failed") => void) | undefined;

  constructor(
    item: OpenItem,
    served: Served,
    options: AnswerOptions,
    deadline: number,
    gaveUp: readonly GivenUp[],
    onEnd: ((verdict: "ok" | "failed") => void) | undefined,
  ) {
    this.#item = item;
    this.#served = served;
    this.#options = options;
    this.#gaveUp = gaveUp;
    this.#onEnd = onEnd;
    // No request may outlive its timeout (counted from its first attempt), even if the
    // origin stops sending without closing.
    this.#deadline = setTimeout(() => this.#onTimeout(), Math.max(0, deadline - Date.now()));
  }

  /** Hands the body to the client as it comes; settles once the item ended. */
  stream(): Response {
    const { head } = this.#item;
    let clientGone = false;
    let gaveUp: ReturnType<typeof setTimeout> | undefined;
    const gone = (): void => {
      if (clientGone || this.#finished) return;
      clientGone = true;
      streamed.clientGone();
      // The work ended for the client: its slot comes back now, its bill once it is known.
      this.#options.onReleased?.({
        model: this.#options.model,
        outcome: "cancelled",
        usage: null,
        usageUnknown: true,
        ...this.#served,
        status: head.status,
        originBegan: head.status < 400,
        firstByteAt: streamed.firstByteAt(),
      });
      // The item's END still reports the tokens generated until then; should none come, its
      // origin's outcome record does.
      gaveUp = setTimeout(() => {
        this.#item.cancel();
        void this.#finish("cancelled", null, head.status, streamed.firstByteAt());
      }, this.#options.endWaitMs ?? END_WAIT_MS);
    };
    const streamed = this.#item.stream(gone);
    const signal = this.#options.signal;
    const stopListening = () => {
      signal?.removeEventListener("abort", gone);
      if (gaveUp !== undefined) clearTimeout(gaveUp);
    };
    let timedOut = false;
    this.#onTimeout = () => {
      timedOut = true;
      streamed.timeOut();
      stopListening();
      // Settled once the item ended (a Batcher first ends its body with the timeout event
      // and stops the item), at most END_WAIT_MS later: nothing else may stop it meanwhile.
      gaveUp = setTimeout(
        () => void this.#finish("timeout", null, head.status, streamed.firstByteAt()),
        this.#options.endWaitMs ?? END_WAIT_MS,
      );
    };
    if (signal?.aborted === true) gone();
    else signal?.addEventListener("abort", gone, { once: true });
    void streamed.ended.then((end) => {
      stopListening();
      // Cut at the request's own time limit: no origin's fault, billed for what it generated.
      if (timedOut) {
        const trailer = end.kind === "end" ? end.trailer : null;
        void this.#finish("timeout", trailer, head.status, streamed.firstByteAt());
        return;
      }
      if (end.kind === "closed") {
        // A raw body that ended whole: its origin's outcome record says what it generated.
        if (!this.#finished) this.#onEnd?.("ok");
        void this.#finish(
          clientGone ? "cancelled" : "ok",
          null,
          head.status,
          streamed.firstByteAt(),
        );
        return;
      }
      if (end.kind === "broken") {
        if (!this.#finished) this.#onEnd?.(clientGone ? "ok" : "failed");
        if (!clientGone) this.#warn("origin failed mid-stream", end.detail);
        const outcome = clientGone ? "cancelled" : "error";
        void this.#finish(outcome, null, head.status, streamed.firstByteAt());
        return;
      }
      const { trailer } = end;
      // The upstream cancels an item whose client's body went away before this edge knew.
      if (clientGone || trailer.outcome === "cancelled") {
        if (!this.#finished) this.#onEnd?.("ok");
        void this.#finish("cancelled", trailer, head.status, streamed.firstByteAt());
        return;
      }
      const ended = endOutcome(trailer, head.status);
      if (!ended.complete) this.#warn("origin failed mid-stream", trailer.error?.message);
      // Cut by its origin, not by the request's own time limit.
      if (ended.outcome !== "timeout" && !this.#finished) {
        this.#onEnd?.(ended.complete ? "ok" : "failed");
      }
      void this.#finish(ended.outcome, trailer, head.status, streamed.firstByteAt());
    });
    const body =
      this.#options.path === "/v1/responses" && head.status < 400
        ? streamed.body.pipeThrough(responsesFailureEnding())
        : streamed.body;
    return new Response(body, { status: head.status, headers: this.#headers() });
  }

  /** Answers with the whole answer read, or rejects with the failure it ended in. */
  async whole(read: WholeRead): Promise<Response> {
    const { head } = this.#item;
    const { body, end, timedOut } = read;
    const trailer = end.kind === "end" ? end.trailer : null;
    const { complete, outcome: endedAs } =
      end.kind === "closed"
        ? { complete: true, outcome: "ok" as const }
        : trailer === null
          ? { complete: false, outcome: "error" as const }
          : endOutcome(trailer, head.status);
    // Cut short: by the request's timeout, or because its client went away (the item was
    // cancelled on its origin, whose END still reports what it generated).
    const outcome: Outcome = complete
      ? endedAs
      : timedOut
        ? "timeout"
        : this.#options.signal?.aborted === true
          ? "cancelled"
          : endedAs;
    const failure = complete
      ? null
      : originFailure(outcome === "timeout" ? "timeout" : "bad_answer");
    await this.#finish(outcome, trailer, failure?.status ?? head.status);
    if (failure !== null) {
      this.#warn("origin failed mid-response", detailOf(end) ?? outcome);
      throw failure;
    }
    return new Response(body, { status: head.status, headers: this.#headers() });
  }

  /**
   * Ends the request once: the deadline stops, the pool hears of it, and it is settled with
   * what its origin generated, from its END or, when none came, its origin's outcome record
   * (or with what an attempt given up on before generated, should that one be billed).
   */
  async #finish(
    outcome: Outcome,
    trailer: ItemTrailer | null,
    status: number,
    firstByteAt: number | null = null,
  ): Promise<void> {
    if (this.#finished) return;
    this.#finished = true;
    clearTimeout(this.#deadline);
    const options = this.#options;
    options.pool.end(this.#served.origin);
    const { head } = this.#item;
    // An engine's own error answer (a HEAD of 400 or more) generated nothing. Without an END
    // (a raw body, or one cut short), its origin's outcome record tells.
    let usage: Pick<SettledRequest, "usage" | "usageUnknown"> = { usage: trailer?.usage ?? null };
    let ended = trailer?.outcome ?? null;
    let ttftMs = trailer?.timing?.ttft_ms ?? null;
    if (trailer === null && head.status < 400) {
      const generated = await generatedBy(
        originsNamed(options.candidates, [this.#served.origin]),
        options.requestId,
        [head.id],
        options.secrets,
        options.lookup === undefined ? ORIGIN_ASK : { ...ORIGIN_ASK, lookup: options.lookup },
      );
      usage = billed(generated);
      if (generated.known) {
        ended = generated.outcome;
        ttftMs = generated.ttftMs ?? null;
      }
    }
    const bill = await servedOrGivenUp(
      { ...usage, ...this.#served, outcome: ended },
      options.requestId,
      this.#gaveUp,
      options.secrets,
    );
    options.onSettled({
      model: options.model,
      outcome,
      usage: bill.usage,
      ...(bill.usageUnknown === true && { usageUnknown: true }),
      region: bill.region,
      origin: bill.origin,
      status,
      originBegan: head.status < 400,
      ttftMs,
      firstByteAt,
    });
  }

  #warn(what: string, detail: string | undefined): void {
    logWarn(what, { request_id: this.#options.requestId, origin: this.#served.origin, detail });
  }

  // Built as a list and handed over once: each `Headers.set` is a call into the runtime.
  #headers(): [string, string][] {
    const headers: [string, string][] = [];
    const own = this.#options.answerHeaders ?? [];
    for (const [name, value] of Object.entries(this.#item.head.headers)) {
      const lower = name.toLowerCase();
      if (DROPPED_HEADERS.has(lower) || OWN_HEADERS.has(lower)) continue;
      if (!own.some(([ownName]) => ownName === lower)) headers.push([name, value]);
    }
    for (const [name, value] of own) headers.push([name, value]);
    headers.push(["x-warmgate-region", this.#served.region]);
    headers.push(["x-warmgate-origin", this.#served.origin]);
    // How many origins were tried for it, this one included (failed ones are not billed).
    headers.push(["x-warmgate-attempts", String(Math.max(1, this.#options.attempts?.length ?? 1))]);
    return headers;
  }
}

function detailOf(end: ItemEnd): string | undefined {
  if (end.kind === "closed") return undefined;
  return end.kind === "broken" ? end.detail : end.trailer.error?.message;
}

/**
 * How an item whose END came ends for its client: complete when the engine finished it (or
 * answered with its own error, a 4xx, which is whole whatever its outcome says), otherwise
 * failed after its HEAD.
 */
function endOutcome(trailer: ItemTrailer, status: number): { complete: boolean; outcome: Outcome } {
  if (trailer.outcome === "ok") return { complete: true, outcome: "ok" };
  // Timed out, whatever status the origin gave the cut item (a cancelled one is 499).
  if (trailer.outcome === "timeout") return { complete: false, outcome: "timeout" };
  if (status >= 400) return { complete: true, outcome: "error" };
  return { complete: false, outcome: "error" };
}

// The edge's own headers, which replace any an engine sent.
const OWN_HEADERS = new Set(["x-warmgate-region", "x-warmgate-origin", "x-warmgate-attempts"]);

// Hop-by-hop headers (RFC 9110 §7.6.1) and framing the runtime sets for the client itself.
const DROPPED_HEADERS = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "proxy-connection",
  "content-length",
]);
