/**
 * What origins remember of a request's items (`POST /v1/batch/outcomes`, origin/PROTOCOL.md),
 * and the one rule for what a request generated: asked by the edge for an attempt whose END
 * never reached it, before the request is settled, and by a key's account for a request
 * whose lease lapsed. See docs/key-account.md, "Billing every outcome".
 */
import { credentialRefused, credentialValues } from "./credentials.ts";
import { sleep } from "./sleep.ts";
import {
  BATCH_CANCEL_PATH,
  type CancelRequest,
  type ItemOutcome,
  type ItemRecord,
  type ItemUsage,
  MAX_OUTCOME_IDS,
  MAX_OUTCOME_PREFIXES,
  OUTCOMES_PATH,
  type OutcomesRequest,
  OutcomesResponseSchema,
  attemptOf,
  requestIdOf,
} from "./protocol/schema.ts";

/** An origin to ask. */
export interface OutcomeSource {
  id: string;
  url: string;
  /** Names of the secrets it takes as bearer tokens, in order (see `credentials.ts`). */
  credentials?: readonly string[] | undefined;
}

/** Longest wait for one origin's answer. */
export const OUTCOME_LOOKUP_TIMEOUT_MS = 3_000;

/** An item as an origin remembers it, with the origin that ran it. */
export type FoundItem = ItemRecord & { origin: string };

/** What the origins say of one request. */
export type Reconciled =
  /** An item still runs: ask again later. */
  | { kind: "running" }
  /** No origin remembers it: it never reached one, or that origin lost it. */
  | { kind: "unknown" }
  /** The attempt to bill: its item id, its origin, how it ended and what it generated. */
  | {
      kind: "ended";
      item: string;
      origin: string;
      outcome: ItemOutcome;
      usage: ItemUsage | null;
      /** From its arrival at the origin to its first body byte, when the origin told. */
      ttftMs?: number | null;
    };

/**
 * How each request ended, by what its items' origins remember. The attempt that finished
 * wins; else the one that generated the most.
 */
export function reconcile(
  requestIds: readonly string[],
  items: readonly FoundItem[],
): Map<string, Reconciled> {
  const byRequest = new Map<string, FoundItem[]>();
  for (const item of items) {
    const id = requestIdOf(item.id);
    const found = byRequest.get(id);
    if (found === undefined) byRequest.set(id, [item]);
    else found.push(item);
  }
  const result = new Map<string, Reconciled>();
  for (const id of requestIds) {
    const found = byRequest.get(id) ?? [];
    if (found.some((item) => item.state === "running")) {
      result.set(id, { kind: "running" });
      continue;
    }
    let best: Extract<FoundItem, { state: "ended" }> | null = null;
    for (const item of found) {
      if (item.state !== "ended") continue;
      if (best === null || billedBefore(item, best)) best = item;
    }
    result.set(
      id,
      best === null
        ? { kind: "unknown" }
        : {
            kind: "ended",
            item: best.id,
            origin: best.origin,
            outcome: best.outcome,
            usage: best.usage,
            ...(best.timing !== undefined && { ttftMs: best.timing.ttft_ms }),
          },
    );
  }
  return result;
}

/** How an attempt ended, as the billing rule weighs it. */
export interface AttemptEnd {
  outcome: ItemOutcome;
  usage: ItemUsage | null;
}

/**
 * The one rule for which of a request's attempts is billed: `a` over `b` when `a` finished
 * and `b` did not, or neither did and `a` generated more; at equal output, the one whose
 * origin read more of the prompt (an attempt cut after its prefill still read it, one
 * refused before any did not), then the one that computed more of it (fewer cached tokens).
 * Attempts it ranks equal have equal usage, so which of them is read first never changes a bill.
 */
export function outranks(a: AttemptEnd, b: AttemptEnd): boolean {
  const [ra, rb] = [rank(a), rank(b)];
  for (let i = 0; i < ra.length; i++) if (ra[i] !== rb[i]) return ra[i]! > rb[i]!;
  return false;
}

function rank(item: AttemptEnd): readonly number[] {
  const usage = item.usage;
  return [
    item.outcome === "ok" ? 1 : 0,
    usage?.completion_tokens ?? 0,
    usage === null ? -1 : usage.prompt_tokens,
    usage === null ? 0 : -usage.cached_tokens,
  ];
}

/** `a` is billed rather than `b`: it outranks it, or they tie and `a` was the earlier attempt. */
function billedBefore(a: FoundItem & AttemptEnd, b: FoundItem & AttemptEnd): boolean {
  return outranks(a, b) || (!outranks(b, a) && attemptOf(a.id) < attemptOf(b.id));
}

/** What one lookup asks about: request ids, and request-id prefixes (each every request under it). */
export interface OutcomeQuery {
  ids: readonly string[];
  prefixes?: readonly string[];
}

/** What a lookup found (see {@link lookupOutcomes}). */
export interface OutcomeLookupResult {
  items: FoundItem[];
  complete: boolean;
  silent: Set<string>;
}

/** A way to ask origins about requests: {@link lookupOutcomes}, or one that gathers asks. */
export type OutcomeLookup = (
  sources: readonly OutcomeSource[],
  query: OutcomeQuery,
  secrets: object,
  timeoutMs?: number,
) => Promise<OutcomeLookupResult>;

/**
 * Asks every origin about the requests `query` names; `complete` is false when an origin
 * did not answer (then a request none of the others remembers may yet be found there), and
 * `silent` holds the URLs of those that did not.
 */
export async function lookupOutcomes(
  sources: readonly OutcomeSource[],
  query: OutcomeQuery,
  secrets: object,
  timeoutMs = OUTCOME_LOOKUP_TIMEOUT_MS,
): Promise<OutcomeLookupResult> {
  const ids = [...query.ids];
  const prefixes = [...(query.prefixes ?? [])];
  if (ids.length > MAX_OUTCOME_IDS) throw new Error(`at most ${MAX_OUTCOME_IDS} ids a lookup`);
  if (prefixes.length > MAX_OUTCOME_PREFIXES) {
    throw new Error(`at most ${MAX_OUTCOME_PREFIXES} prefixes a lookup`);
  }
  const answers = await Promise.all(
    sources.map(async (source) => {
      const body: OutcomesRequest = { ids, ...(prefixes.length > 0 && { prefixes }) };
      const response = await postTo(source, OUTCOMES_PATH, body, secrets, timeoutMs);
      if (response === null) return null;
      let answer: unknown;
      try {
        answer = await response.json();
      } catch {
        return null;
      }
      // An answer of another shape is an origin that did not answer.
      const parsed = OutcomesResponseSchema.safeParse(answer);
      if (!parsed.success) return null;
      return parsed.data.items.map((item): FoundItem => ({ ...item, origin: source.id }));
    }),
  );
  return joinAnswers(sources, answers);
}

/** Each origin's answer to one lookup (null: it did not answer), as the lookup's result. */
export function joinAnswers(
  sources: readonly OutcomeSource[],
  answers: readonly (FoundItem[] | null)[],
): OutcomeLookupResult {
  const items: FoundItem[] = [];
  const silent = new Set<string>();
  for (const [i, answer] of answers.entries()) {
    if (answer === null) silent.add(sources[i]?.url ?? "");
    else items.push(...answer);
  }
  return { items, complete: silent.size === 0, silent };
}

/**
 * Cancels items by their ids alone on `source`, in whichever batch runs them (an origin
 * that has not seen one yet stops it when it comes); false when the origin did not answer.
 */
export async function cancelItems(
  source: OutcomeSource,
  ids: readonly string[],
  secrets: object,
  timeoutMs = OUTCOME_LOOKUP_TIMEOUT_MS,
): Promise<boolean> {
  const body: CancelRequest = { ids: [...ids] };
  const response = await postTo(source, BATCH_CANCEL_PATH, body, secrets, timeoutMs);
  await response?.body?.cancel().catch(() => {});
  return response !== null;
}

/** How {@link settledOutcome} asks. */
export interface SettledOutcomeOptions {
  /** Lookups at most, while an item still runs (default 5). */
  tries?: number;
  /** Between those lookups (default 200 ms). */
  intervalMs?: number;
  /** Longest wait for one origin's answer (default {@link OUTCOME_LOOKUP_TIMEOUT_MS}). */
  timeoutMs?: number;
  /** How each lookup asks (default {@link lookupOutcomes}). */
  lookup?: OutcomeLookup;
}

/**
 * What the origins say request `requestId` generated, for settling it now: the items
 * `itemIds` only (all of the request's when null). An item that still runs is cancelled on
 * its origin and asked for again (at most `tries` lookups). `complete` is false when the
 * answer may still change: an item ran at the last try, or an origin did not answer and
 * none finished the request there (a silent origin may hold an attempt that outranks it).
 */
export async function settledOutcome(
  sources: readonly OutcomeSource[],
  requestId: string,
  itemIds: readonly string[] | null,
  secrets: object,
  options: SettledOutcomeOptions = {},
): Promise<{ found: Reconciled; complete: boolean }> {
  const tries = options.tries ?? 5;
  let last: { found: Reconciled; complete: boolean } = {
    found: { kind: "unknown" },
    complete: false,
  };
  for (let attempt = 0; attempt < tries; attempt++) {
    if (attempt > 0) await sleep(options.intervalMs ?? 200);
    const { items, complete } = await (options.lookup ?? lookupOutcomes)(
      sources,
      { ids: [requestId] },
      secrets,
      options.timeoutMs,
    );
    const mine = itemIds === null ? items : items.filter((item) => itemIds.includes(item.id));
    const found = reconcile([requestId], mine).get(requestId) ?? { kind: "unknown" };
    if (found.kind === "ended") return { found, complete: complete || found.outcome === "ok" };
    // An origin that does not answer now is not waited for: the request's settlement is.
    if (found.kind === "unknown") return { found, complete };
    last = { found, complete: false };
    // Nothing of it may run on once it is settled (its client is gone, or refused).
    await Promise.all(
      sources.map(async (source) => {
        const running = mine.filter((i) => i.origin === source.id && i.state === "running");
        if (running.length === 0) return;
        const ids = running.map((item) => item.id);
        await cancelItems(source, ids, secrets, options.timeoutMs);
      }),
    );
  }
  return last;
}

/** Posts JSON to an origin, each of its credentials in turn until one is not refused. */
async function postTo(
  source: OutcomeSource,
  path: string,
  body: unknown,
  secrets: object,
  timeoutMs: number,
): Promise<Response | null> {
  const tokens: (string | undefined)[] = credentialValues(secrets, source.credentials);
  for (const token of tokens.length === 0 ? [undefined] : tokens) {
    try {
      const response = await fetch(`${source.url.replace(/\/+$/, "")}${path}`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
        },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      if (response.ok) return response;
      await response.body?.cancel().catch(() => {});
      if (!credentialRefused(response.status)) return null;
    } catch {
      return null;
    }
  }
  return null;
}
