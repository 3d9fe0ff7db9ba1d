/**
 * The client side of `npm run bench:burst` (docs/benchmarks.md, "Burst"): one streaming chat
 * request and what it came to (served whole, refused at once, cut after its first byte, or
 * failed without an answer), the SSE reading that decides it, the poison request, and the
 * tally of a set of outcomes.
 */
import { summarize } from "./lib.ts";

/** What one request came to, as its client saw it. */
export type OutcomeKind = "whole" | "refused" | "cut" | "failed";

/** One request's outcome and times (ms from when it was sent). */
export interface Outcome {
  kind: OutcomeKind;
  /** HTTP status; null when no answer came (`failed`). */
  status: number | null;
  /** The OpenAI error code of a refusal or of a stream's error event. */
  code: string | null;
  /** A refusal carried `retry-after` (or `retry-after-ms`). */
  retryAfter: boolean;
  /** Time to the first content token; null when none came. */
  ttftMs: number | null;
  totalMs: number;
  /** Content tokens (events with content) received. */
  tokens: number;
  /** `x-warmgate-origin` of the answer. */
  origin: string | null;
  attempts: number;
  /** Epoch ms when it was sent. */
  sentAt: number;
  /** Why a request failed without an answer. */
  error?: string;
}

/** What a stream's SSE events said: whether it ended, errored, and when the first token came. */
export interface StreamVerdict {
  done: boolean;
  errorCode: string | null;
  errorEvent: boolean;
  tokens: number;
}

/** Splits SSE text into events across chunk boundaries and reads the ones that matter. */
export class SseReader {
  #buffer = "";
  readonly verdict: StreamVerdict = { done: false, errorCode: null, errorEvent: false, tokens: 0 };

  /** Feeds decoded text; answers how many content tokens it completed. */
  feed(text: string): number {
    this.#buffer += text.replaceAll("\r\n", "\n");
    let tokens = 0;
    for (;;) {
      const end = this.#buffer.indexOf("\n\n");
      if (end < 0) return tokens;
      const event = this.#buffer.slice(0, end);
      this.#buffer = this.#buffer.slice(end + 2);
      tokens += this.#event(event);
    }
  }

  #event(event: string): number {
    const data = event
      .split("\n")
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).trimStart())
      .join("\n");
    if (data === "") return 0;
    if (data === "[DONE]") {
      this.verdict.done = true;
      return 0;
    }
    let parsed: { error?: { code?: unknown }; choices?: { delta?: { content?: unknown } }[] };
    try {
      parsed = JSON.parse(data) as typeof parsed;
    } catch {
      return 0;
    }
    if (parsed.error !== undefined) {
      this.verdict.errorEvent = true;
      const code = parsed.error?.code;
      this.verdict.errorCode = typeof code === "string" ? code : null;
      return 0;
    }
    const content = parsed.choices?.[0]?.delta?.content;
    if (typeof content !== "string" || content === "") return 0;
    this.verdict.tokens += 1;
    return 1;
  }
}

/** Whether a stream that answered 200 was served whole: `[DONE]` came and no error event. */
export function servedWhole(verdict: StreamVerdict): boolean {
  return verdict.done && !verdict.errorEvent;
}

/** Options of {@link sendChat}. */
export interface ChatOptions {
  edgeUrl: string;
  key: string;
  /** The request's body (JSON text). */
  body: string;
  /** Extra request headers (`x-warmgate-region`, `x-warmgate-origin`). */
  headers?: Record<string, string>;
  timeoutMs: number;
}

/** The body of an ordinary streamed chat request (16 tokens), distinct per `index`. */
export function chatBody(index: number, maxTokens = 16): string {
  return JSON.stringify({
    model: "warmgate-sim-8b",
    stream: true,
    max_tokens: maxTokens,
    messages: [{ role: "user", content: `Burst request ${index}: say something short.` }],
  });
}

/**
 * A chat request whose `response_format` holds a JSON schema nested `depth` levels deep,
 * written as text (JSON.stringify would recurse that deep).
 */
export function poisonBody(depth: number): string {
  const open = '{"type":"object","properties":{"a":';
  const schema = `${open.repeat(depth)}{"type":"string"}${"}}".repeat(depth)}`;
  return (
    `{"model":"warmgate-sim-8b","stream":true,"max_tokens":16,` +
    `"messages":[{"role":"user","content":"Answer in JSON."}],` +
    `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${schema}}}}`
  );
}

function errorCodeOf(text: string): string | null {
  try {
    const code = (JSON.parse(text) as { error?: { code?: unknown } }).error?.code;
    return typeof code === "string" ? code : null;
  } catch {
    return null;
  }
}

/** Sends one chat request, reads its answer to the end, and classifies it. */
export async function sendChat(options: ChatOptions): Promise<Outcome> {
  const sentAt = Date.now();
  const started = performance.now();
  const elapsed = () => performance.now() - started;
  const outcome: Outcome = {
    kind: "failed",
    status: null,
    code: null,
    retryAfter: false,
    ttftMs: null,
    totalMs: 0,
    tokens: 0,
    origin: null,
    attempts: 0,
    sentAt,
  };
  try {
    const res = await fetch(`${options.edgeUrl}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${options.key}`,
        "content-type": "application/json",
        ...options.headers,
      },
      body: options.body,
      signal: AbortSignal.timeout(options.timeoutMs),
    });
    outcome.status = res.status;
    outcome.origin = res.headers.get("x-warmgate-origin");
    outcome.attempts = Number(res.headers.get("x-warmgate-attempts") ?? "0");
    if (res.status !== 200) {
      outcome.kind = "refused";
      outcome.retryAfter = res.headers.has("retry-after") || res.headers.has("retry-after-ms");
      outcome.code = errorCodeOf(await res.text());
      outcome.totalMs = elapsed();
      return outcome;
    }
    const reader = new SseReader();
    const decoder = new TextDecoder();
    const body = res.body?.getReader();
    try {
      for (;;) {
        const chunk = await body?.read();
        if (chunk === undefined || chunk.done) break;
        const tokens = reader.feed(decoder.decode(chunk.value, { stream: true }));
        if (tokens > 0 && outcome.ttftMs === null) outcome.ttftMs = elapsed();
      }
    } catch (error) {
      // The body broke off: a cut, whatever had arrived.
      outcome.error = String(error).slice(0, 160);
    }
    outcome.tokens = reader.verdict.tokens;
    outcome.code = reader.verdict.errorCode;
    outcome.kind = outcome.error === undefined && servedWhole(reader.verdict) ? "whole" : "cut";
  } catch (error) {
    outcome.error = String(error).slice(0, 160);
  }
  outcome.totalMs = elapsed();
  return outcome;
}

/** Counts of a set of outcomes. */
export interface Tally {
  sent: number;
  whole: number;
  refused: number;
  refusedWithRetryAfter: number;
  /** Streams cut after their first byte; of them, those cut after tokens arrived. */
  cut: number;
  cutAfterTokens: number;
  failed: number;
  /** Answers (refusals or error events) with code `no_healthy_origin`. */
  noHealthyOrigin: number;
  /** Refusals and cuts by `status code`. */
  errors: Record<string, number>;
  ttftP50: number;
  ttftP99: number;
}

/** Tallies outcomes. */
export function tally(outcomes: readonly Outcome[]): Tally {
  const count = (test: (o: Outcome) => boolean) => outcomes.filter(test).length;
  const errors: Record<string, number> = {};
  for (const o of outcomes) {
    if (o.kind === "whole") continue;
    const key =
      o.kind === "failed"
        ? `no answer: ${o.error ?? "?"}`
        : `${o.kind} ${o.status} ${o.code ?? "-"}${o.kind === "refused" && !o.retryAfter ? " (no retry-after)" : ""}`;
    errors[key] = (errors[key] ?? 0) + 1;
  }
  const ttft = summarize(
    outcomes.filter((o) => o.kind === "whole" && o.ttftMs !== null).map((o) => o.ttftMs as number),
  );
  return {
    sent: outcomes.length,
    whole: count((o) => o.kind === "whole"),
    refused: count((o) => o.kind === "refused"),
    refusedWithRetryAfter: count((o) => o.kind === "refused" && o.retryAfter),
    cut: count((o) => o.kind === "cut"),
    cutAfterTokens: count((o) => o.kind === "cut" && o.tokens > 0),
    failed: count((o) => o.kind === "failed"),
    noHealthyOrigin: count((o) => o.code === "no_healthy_origin"),
    errors,
    ttftP50: ttft.p50,
    ttftP99: ttft.p99,
  };
}
