/**
 * One client of the chaos trial (`npm run bench:chaos`, docs/benchmarks.md): sends a
 * request of a drawn kind and says what it saw, as an application would: a whole answer
 * with its usage, an OpenAI error, a stream cut with an error event, a cut connection, or
 * a 200 that ended without its end (a silent truncation); and the counts of such outcomes.
 */

/** The kinds of request the trial mixes. */
export type ChaosKind = "json" | "stream" | "n" | "abort";

/** Usage as a client sees it. */
export interface SeenUsage {
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens: number;
}

/** What one request came to, from the client's side. */
export interface ChaosOutcome {
  kind: ChaosKind;
  status: number | null;
  requestId: string | null;
  /** A whole answer with its usage (JSON parsed, or a stream up to `[DONE]`). */
  complete: boolean;
  usage: SeenUsage | null;
  /** A 200 whose body ended cleanly without its end or an error event. */
  silentlyTruncated: boolean;
  /** A stream that ended with an OpenAI error event. */
  errorEvent: boolean;
  /** The connection failed (refused or reset): visible to the client. */
  connectionFailed: boolean;
  /** A status of 400 or more whose body is not OpenAI's error shape. */
  badErrorBody: boolean;
  /** The error code of an error answer. */
  code: string | null;
  /** A 429's `retry-after-ms`, which a client honours as the SDKs do. */
  retryAfterMs: number | null;
}

/** Draws the next request's kind: 40% JSON, 35% streams, 10% `n` > 1, 15% client aborts. */
export function drawKind(random: () => number): ChaosKind {
  const x = random();
  return x < 0.4 ? "json" : x < 0.75 ? "stream" : x < 0.85 ? "n" : "abort";
}

function isOpenAIError(body: unknown): body is { error: { code: string | null } } {
  if (typeof body !== "object" || body === null) return false;
  const error = (body as { error?: unknown }).error;
  if (typeof error !== "object" || error === null) return false;
  const e = error as Record<string, unknown>;
  return typeof e.message === "string" && typeof e.type === "string" && "param" in e && "code" in e;
}

function usageOf(raw: unknown): SeenUsage | null {
  if (typeof raw !== "object" || raw === null) return null;
  const u = raw as {
    prompt_tokens?: number;
    completion_tokens?: number;
    prompt_tokens_details?: { cached_tokens?: number } | null;
  };
  if (typeof u.prompt_tokens !== "number" || typeof u.completion_tokens !== "number") return null;
  return {
    prompt_tokens: u.prompt_tokens,
    completion_tokens: u.completion_tokens,
    cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

/** Sends one chat request of `kind` and classifies what came back. */
export async function sendChaos(
  url: string,
  key: string,
  kind: ChaosKind,
  random: () => number,
  index: number,
): Promise<ChaosOutcome> {
  const stream = kind === "stream" || kind === "abort";
  const body = {
    model: "warmgate-sim-8b",
    messages: [
      { role: "user", content: `Chaos request ${index}: tell me about ${index % 7} seas.` },
    ],
    max_tokens: 8 + Math.floor(random() * 56),
    ...(kind === "n" ? { n: 2 + Math.floor(random() * 3) } : {}),
    ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
  };
  const outcome: ChaosOutcome = {
    kind,
    status: null,
    requestId: null,
    complete: false,
    usage: null,
    silentlyTruncated: false,
    errorEvent: false,
    connectionFailed: false,
    badErrorBody: false,
    code: null,
    retryAfterMs: null,
  };
  const abort = new AbortController();
  const abortAfter = kind === "abort" ? 20 + random() * 300 : null;
  const timer = abortAfter === null ? null : setTimeout(() => abort.abort(), abortAfter);
  try {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: abort.signal,
    });
    outcome.status = res.status;
    outcome.requestId = res.headers.get("x-request-id");
    const retryAfter = Number(res.headers.get("retry-after-ms") ?? Number.NaN);
    if (res.status === 429 && Number.isFinite(retryAfter)) outcome.retryAfterMs = retryAfter;
    const text = await res.text();
    if (res.status >= 400) {
      let parsed: unknown = null;
      try {
        parsed = JSON.parse(text);
      } catch {
        // Not JSON: not OpenAI's shape either.
      }
      outcome.badErrorBody = !isOpenAIError(parsed);
      outcome.code = isOpenAIError(parsed) ? parsed.error.code : null;
      return outcome;
    }
    if (!stream) {
      try {
        const json = JSON.parse(text) as { usage?: unknown; choices?: unknown[] };
        outcome.usage = usageOf(json.usage);
        outcome.complete = outcome.usage !== null && Array.isArray(json.choices);
      } catch {
        outcome.silentlyTruncated = true;
      }
      return outcome;
    }
    const events = text.split("\n\n").filter((event) => event.startsWith("data: "));
    for (const event of events) {
      const data = event.slice(6).trim();
      if (data === "[DONE]") continue;
      const parsed = JSON.parse(data) as { usage?: unknown; error?: unknown };
      if (parsed.error !== undefined) outcome.errorEvent = true;
      const usage = usageOf(parsed.usage);
      if (usage !== null) outcome.usage = usage;
    }
    const done = events.at(-1)?.trim() === "data: [DONE]";
    outcome.complete = done && outcome.usage !== null && !outcome.errorEvent;
    outcome.silentlyTruncated = !done && !outcome.errorEvent;
    return outcome;
  } catch {
    // An abort the client made, or a connection the edge's restart cut: either way seen.
    outcome.connectionFailed = !abort.signal.aborted;
    return outcome;
  } finally {
    if (timer !== null) clearTimeout(timer);
  }
}

/** What the clients saw, counted; the same for all requests and for the burst alone. */
export interface ChaosCounts {
  sent: number;
  complete: number;
  billedExactly: number;
  clientAborts: number;
  /** Client aborts that reached the edge after it had written the whole answer. */
  abortsAfterTheEnd: number;
  /** Connections refused or cut (the edge restart, mostly): the client saw them. */
  connectionsFailed: number;
  /** OpenAI-shaped 502/503/504 answers: origins that failed every attempt. */
  originFailures: number;
  /** OpenAI-shaped 429 answers (origins full, or the key's own limits). */
  rateLimited: number;
  streamsEndedWithErrorEvent: number;
}

/**
 * Counts `outcomes`; `billed` holds those billed exactly, `abortsAfterTheEnd` the client
 * aborts the edge recorded as delivered.
 */
export function countOutcomes(
  outcomes: readonly ChaosOutcome[],
  billed: ReadonlySet<ChaosOutcome>,
  abortsAfterTheEnd: ReadonlySet<ChaosOutcome>,
): ChaosCounts {
  const count = (test: (o: ChaosOutcome) => boolean) => outcomes.filter(test).length;
  return {
    sent: outcomes.length,
    complete: count((o) => o.complete),
    billedExactly: count((o) => billed.has(o)),
    clientAborts: count((o) => o.kind === "abort" && !o.complete && !o.connectionFailed),
    abortsAfterTheEnd: count((o) => abortsAfterTheEnd.has(o)),
    connectionsFailed: count((o) => o.connectionFailed),
    originFailures: count((o) => o.status !== null && o.status >= 502 && !o.badErrorBody),
    rateLimited: count((o) => o.status === 429),
    streamsEndedWithErrorEvent: count((o) => o.errorEvent),
  };
}
