/**
 * Items on an origin, whichever route they came by: each one's run (abort reason, engine
 * id), its engine request, its trailer, and the outcome log that remembers it
 * (origin/PROTOCOL.md, "Outcomes").
 */
import { BackgroundLane, type BackgroundOptions } from "./background.ts";
import { CancelMemory } from "./cancels.ts";
import { KvEventLog } from "./kv-events.ts";
import type { Engine, EngineItem, EngineOutcome, EngineResponse } from "./engine.ts";
import type { AbortReason, OriginCounters } from "./metrics.ts";
import { OutcomeLog } from "./outcome-log.ts";
import type { ItemPath, ItemTrailer } from "../contracts/protocol/schema.ts";
import { type ErrorCode, type ErrorType, openAIErrorBody } from "../contracts/errors.ts";

/** Engine response headers that describe a connection, not the response (RFC 9110 §7.6.1). */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "content-length",
  "content-encoding",
  "upgrade",
  "proxy-connection",
  "trailer",
  "te",
]);

/** One item's life on this origin. */
export interface ItemRun {
  controller: AbortController;
  reason: AbortReason | null;
  done: boolean;
}

/** What an item needs, whichever route it came from. */
export interface ItemSpec {
  id: string;
  path: ItemPath;
  body: string;
  headers: Record<string, string>;
  priority: number;
  /** Waits for slots interactive items leave (see `background.ts`). */
  background?: boolean;
  timeoutMs?: number;
}

/** An item whose status and headers are known; drain `body`, then call `finish`. */
export interface OpenedItem {
  status: number;
  headers: Record<string, string>;
  body: AsyncIterator<Uint8Array>;
  /** Waits for the engine's outcome; safe to call more than once. */
  finish(): Promise<ItemTrailer>;
}

const encoder = new TextEncoder();

export function syntheticResponse(
  status: number,
  message: string,
  type: ErrorType,
  code: ErrorCode,
  outcome: EngineOutcome["outcome"],
): EngineResponse {
  const body = JSON.stringify(openAIErrorBody(message, type, code));
  return {
    status,
    headers: { "content-type": "application/json" },
    body: (async function* () {
      yield encoder.encode(body);
    })(),
    outcome: Promise.resolve({
      outcome,
      usage: null,
      error: { message, type, code },
      queued_ms: 0,
      ttft_ms: null,
    }),
  };
}

export function abortedResponse(reason: AbortReason): EngineResponse {
  return reason === "timeout"
    ? syntheticResponse(504, "The request timed out.", "server_error", "item_timeout", "timeout")
    : syntheticResponse(
        499,
        "The request was cancelled.",
        "server_error",
        "item_cancelled",
        "cancelled",
      );
}

/** Reads an iterator to its end, ignoring what it yields (engines settle `outcome` after). */
export async function drain(iterator: AsyncIterator<Uint8Array>): Promise<void> {
  try {
    for (;;) {
      const next = await iterator.next();
      if (next.done === true) return;
    }
  } catch {
    // An engine body that throws has ended; its outcome says why.
  }
}

export function cleanHeaders(headers: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    if (!HOP_BY_HOP.has(lower)) out[lower] = value;
  }
  return out;
}

export function isJsonObjectText(text: string): boolean {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === "object" && value !== null && !Array.isArray(value);
  } catch {
    return false;
  }
}

export function roundMs(ms: number): number {
  return Math.round(ms * 100) / 100;
}

/** Runs items on the engine and keeps what every running item needs to be stopped. */
export class ItemRunner {
  readonly #engine: Engine;
  readonly #counters: OriginCounters;
  readonly #active = new Set<ItemRun>();
  readonly #engineIds = new Set<string>();
  #idSuffix = 0;
  /** How recent items ended, for `POST /v1/batch/outcomes`. */
  readonly outcomes = new OutcomeLog();
  /** Cancels that came before their items (see `cancels.ts`). */
  readonly cancels = new CancelMemory();

  /** The engine's block events in the edge's hashes, where the engine reports them. */
  readonly kvLog: KvEventLog | null;

  /** Background items: their queue, preemptions and kept answers. */
  readonly background: BackgroundLane;

  constructor(engine: Engine, counters: OriginCounters, background: BackgroundOptions = {}) {
    this.#engine = engine;
    this.#counters = counters;
    this.background = new BackgroundLane(() => engine.load(), background);
    this.kvLog = engine.onBlocks === undefined ? null : new KvEventLog();
    const log = this.kvLog;
    if (log !== null) engine.onBlocks?.((event) => log.apply(event));
  }

  newRun(): ItemRun {
    const run: ItemRun = { controller: new AbortController(), reason: null, done: false };
    this.#active.add(run);
    return run;
  }

  abortItem(run: ItemRun, reason: AbortReason): boolean {
    if (run.done || run.controller.signal.aborted) return false;
    run.reason = reason;
    this.#counters.cancellations[reason]++;
    run.controller.abort(reason);
    return true;
  }

  /** Aborts every running item with reason `shutdown`. */
  abortAll(): void {
    for (const run of this.#active) this.abortItem(run, "shutdown");
  }

  async openItem(spec: ItemSpec, run: ItemRun): Promise<OpenedItem> {
    const started = performance.now();
    this.#counters.inFlight++;
    // Ids must be unique among running items; a repeat (a retried request) gets a suffix.
    let engineId = spec.id;
    while (this.#engineIds.has(engineId)) engineId = `${spec.id}~${++this.#idSuffix}`;
    this.#engineIds.add(engineId);
    this.outcomes.started(spec.id, Date.now());
    const timer =
      spec.timeoutMs === undefined
        ? undefined
        : setTimeout(() => this.abortItem(run, "timeout"), spec.timeoutMs);
    const signal = run.controller.signal;

    let response: EngineResponse;
    let interactive = false;
    if (signal.aborted) {
      // Cancelled before it started (an early cancel): the engine never sees it.
      response = abortedResponse(run.reason ?? "cancel");
    } else if (!isJsonObjectText(spec.body)) {
      response = syntheticResponse(
        400,
        "The request body must be a JSON object.",
        "invalid_request_error",
        "invalid_json",
        "error",
      );
    } else {
      this.kvLog?.track(engineId, spec.body);
      const engineItem = {
        id: engineId,
        path: spec.path,
        body: spec.body,
        headers: spec.headers,
        signal,
        priority: spec.priority,
      };
      const submit = (item: EngineItem) =>
        this.#engine
          .submit(item)
          .catch((): EngineResponse =>
            syntheticResponse(500, "The engine failed.", "server_error", "engine_error", "error"),
          );
      let submitted: Promise<EngineResponse>;
      if (spec.background === true) {
        submitted = this.background
          .run(engineItem, submit)
          .then((answer) => answer ?? abortedResponse(run.reason ?? "cancel"));
      } else {
        this.background.interactiveStarted();
        interactive = true;
        submitted = submit(engineItem);
      }
      const aborted = new Promise<null>((resolve) => {
        if (signal.aborted) resolve(null);
        else signal.addEventListener("abort", () => resolve(null), { once: true });
      });
      const first = await Promise.race([submitted, aborted]);
      if (first === null) {
        // The engine was told through the signal; still drain what it answers so it can settle.
        void submitted.then(async (late) => {
          await drain(late.body[Symbol.asyncIterator]());
          await late.outcome;
        });
        response = abortedResponse(run.reason ?? "cancel");
      } else {
        response = first;
      }
    }

    let finished: Promise<ItemTrailer> | null = null;
    const finish = (): Promise<ItemTrailer> => {
      finished ??= (async () => {
        const result = await response.outcome;
        if (timer !== undefined) clearTimeout(timer);
        let { outcome, error } = result;
        // Our own abort names the outcome, unless the engine had already finished cleanly.
        if (run.reason !== null && outcome !== "ok") {
          if (run.reason === "timeout") {
            outcome = "timeout";
            error = {
              message: "The request timed out.",
              type: "server_error",
              code: "item_timeout",
            };
          } else {
            outcome = "cancelled";
            error = {
              message: "The request was cancelled.",
              type: "server_error",
              code: "item_cancelled",
            };
          }
        }
        run.done = true;
        this.#active.delete(run);
        this.#engineIds.delete(engineId);
        this.kvLog?.untrack(engineId);
        this.#counters.inFlight--;
        if (interactive) this.background.interactiveEnded();
        // An answer sent again is not a run.
        if (result.replayed === true) this.#counters.replayed++;
        else this.#counters.outcomes[outcome]++;
        const timing = {
          queued_ms: roundMs(result.queued_ms),
          ttft_ms: result.ttft_ms === null ? null : roundMs(result.ttft_ms),
          total_ms: roundMs(performance.now() - started),
        };
        this.outcomes.ended(spec.id, outcome, result.usage, Date.now(), timing);
        const trailer: ItemTrailer = { id: spec.id, outcome, usage: result.usage, timing };
        if (outcome !== "ok" && error !== undefined) trailer.error = error;
        return trailer;
      })();
      return finished;
    };
    return {
      status: response.status,
      headers: cleanHeaders(response.headers),
      body: response.body[Symbol.asyncIterator](),
      finish,
    };
  }
}
