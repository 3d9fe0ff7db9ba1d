/**
 * One client of the chaos trial (`npm run bench:chaos`, docs/benchmarks.md): sends a
 * request of a drawn kind and says what it saw, as an application would: a whole answer
 * with its usage, an OpenAI error, a stream cut with an error event, a cut connection, a
 * 200 that ended without its end (a silent truncation), or its own cancel.
 */

/** The kinds of request the trial mixes. */
export type ChaosKind = "json" | "stream" | "n" | "abort" | "cancel";

/** Usage as a client sees it. */
export interface SeenUsage {
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens: number;
}

/** What one request came to, from the client's side. */
export interface ChaosOutcome {
  kind: ChaosKind;
  /** The `user` it was sent with, unique to it: its ledger rows' end user. */
  user: string;
  status: number | null;
  requestId: string | null;
  /** A whole answer with its usage (JSON parsed, or a stream up to `[DONE]`). */
  complete: boolean;
  usage: SeenUsage | null;
  /** A 200 whose body ended cleanly without its end or an error event. */
  silentlyTruncated: boolean;
  /** A stream that ended with an OpenAI error event. */
  errorEvent: boolean;
  /** The code of that error event. */
  eventCode: string | null;
  /** The client went away itself (a timer, or after its third read). */
  clientAborted: boolean;
  /** The connection failed (refused or reset) without the client asking. */
  connectionFailed: boolean;
  /** A status of 400 or more whose body is not OpenAI's error shape. */
  badErrorBody: boolean;
  /** The error code of an error answer. */
  code: string | null;
  /** A 429 for the key's concurrent requests. */
  concurrencyRefusal: boolean;
  /** A 429's `retry-after-ms`, which a client honours as the SDKs do. */
  retryAfterMs: number | null;
  /** Epoch ms when it was sent and when the client was done with it. */
  sentAt: number;
  endedAt: number;
}

/**
 * Draws the next request's kind: 35% JSON, 30% streams, 10% `n` > 1, 15% streams the client
 * aborts on a timer, 10% long streams it cancels after three reads.
 */
export function drawKind(random: () => number): ChaosKind {
  const x = random();
  return x < 0.35 ? "json" : x < 0.65 ? "stream" : x < 0.75 ? "n" : x < 0.9 ? "abort" : "cancel";
}

type OpenAIError = { error: { code: string | null; message: string } };

function isOpenAIError(body: unknown): body is OpenAIError {
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

/** The chat request body of a kind. */
function bodyOf(kind: ChaosKind, random: () => number, index: number, user: string) {
  const stream = kind === "stream" || kind === "abort" || kind === "cancel";
  return {
    model: "warmgate-sim-8b",
    messages: [
      { role: "user", content: `Chaos request ${index}: tell me about ${index % 7} seas.` },
    ],
    // A cancelled stream is long (seconds of tokens), so its origin is still generating when
    // the cancel comes, even when a loaded machine slows its client's three reads.
    ...(kind === "cancel"
      ? { max_tokens: 1_000 + Math.floor(random() * 1_000), ignore_eos: true }
      : { max_tokens: 8 + Math.floor(random() * 56) }),
    ...(kind === "n" ? { n: 2 + Math.floor(random() * 3) } : {}),
    ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    user,
  };
}

// Reads the body; after `cancelAfter` reads (if given) cancels it and answers null.
async function readBody(res: Response, cancelAfter: number | null): Promise<string | null> {
  const reader = res.body?.getReader();
  if (reader === undefined) return "";
  const decoder = new TextDecoder();
  let text = "";
  for (let reads = 0; ; reads++) {
    if (cancelAfter !== null && reads >= cancelAfter) {
      await reader.cancel();
      return null;
    }
    const { done, value } = await reader.read();
    if (done) return text + decoder.decode();
    text += decoder.decode(value, { stream: true });
  }
}

/** What a request of `kind` has seen when it is sent at `sentAt`: nothing yet. */
export function newOutcome(kind: ChaosKind, user: string, sentAt: number): ChaosOutcome {
  return {
    kind,
    user,
    status: null,
    requestId: null,
    complete: false,
    usage: null,
    silentlyTruncated: false,
    errorEvent: false,
    eventCode: null,
    clientAborted: false,
    connectionFailed: false,
    badErrorBody: false,
    code: null,
    concurrencyRefusal: false,
    retryAfterMs: null,
    sentAt,
    endedAt: 0,
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
  const user = `chaos-${index}`;
  const body = bodyOf(kind, random, index, user);
  const outcome = newOutcome(kind, user, Date.now());
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
    const text = await readBody(res, kind === "cancel" && res.status === 200 ? 3 : null);
    if (text === null) {
      outcome.clientAborted = true;
      return outcome;
    }
    if (res.status >= 400) {
      let parsed: unknown = null;
      try {
        parsed = JSON.parse(text);
      } catch {
        // Not JSON: not OpenAI's shape either.
      }
      outcome.badErrorBody = !isOpenAIError(parsed);
      if (isOpenAIError(parsed)) {
        outcome.code = parsed.error.code;
        outcome.concurrencyRefusal =
          res.status === 429 && parsed.error.message.includes("concurrent requests");
      }
      return outcome;
    }
    if (!("stream" in body)) {
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
      const parsed = JSON.parse(data) as { usage?: unknown; error?: { code?: unknown } };
      if (parsed.error !== undefined) {
        outcome.errorEvent = true;
        outcome.eventCode = typeof parsed.error.code === "string" ? parsed.error.code : null;
      }
      const usage = usageOf(parsed.usage);
      if (usage !== null) outcome.usage = usage;
    }
    const done = events.at(-1)?.trim() === "data: [DONE]";
    outcome.complete = done && outcome.usage !== null && !outcome.errorEvent;
    outcome.silentlyTruncated = !done && !outcome.errorEvent;
    return outcome;
  } catch {
    // An abort the client made, or a connection the edge's restart cut: either way seen.
    outcome.clientAborted = abort.signal.aborted;
    outcome.connectionFailed = !abort.signal.aborted;
    return outcome;
  } finally {
    outcome.endedAt = Date.now();
    if (timer !== null) clearTimeout(timer);
  }
}
