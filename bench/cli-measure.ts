/**
 * One request as `npm run bench` measures it (docs/benchmarks.md, "Any endpoint"): time
 * to the first content token (not to the headers), the gaps between content events, the
 * total, and the output tokens; errors by status and OpenAI error code.
 */
import { EventSourceParserStream } from "eventsource-parser/stream";

/** How one request went. */
export interface Sample {
  ok: boolean;
  status: number;
  /** The OpenAI error code (or type) of a failure; `network` when none answered. */
  code: string | null;
  /** ms to the first content token; the total for a whole answer. */
  ttftMs: number | null;
  /** ms between consecutive content events. */
  itlMs: number[];
  totalMs: number;
  /** Output tokens: the usage's, else content events counted. */
  outputTokens: number;
}

/** What to send. */
export interface RequestSpec {
  url: string;
  key: string;
  model: string;
  prompt: string;
  maxTokens: number;
  stream: boolean;
}

interface Chunk {
  choices?: { delta?: { content?: string | null }; text?: string | null }[];
  usage?: { completion_tokens?: number } | null;
  error?: { code?: string | null; type?: string };
}

function errorCode(body: string, status: number): string {
  try {
    const error = (JSON.parse(body) as Chunk).error;
    return error?.code ?? error?.type ?? `http_${status}`;
  } catch {
    return `http_${status}`;
  }
}

/** Sends one chat completion and measures it. */
export async function measure(spec: RequestSpec, signal?: AbortSignal): Promise<Sample> {
  const started = performance.now();
  const base = { itlMs: [] as number[], ttftMs: null as number | null, outputTokens: 0 };
  let res: Response;
  try {
    res = await fetch(`${spec.url.replace(/\/$/, "")}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${spec.key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: spec.model,
        messages: [{ role: "user", content: spec.prompt }],
        max_tokens: spec.maxTokens,
        ...(spec.stream ? { stream: true, stream_options: { include_usage: true } } : {}),
      }),
      ...(signal ? { signal } : {}),
    });
  } catch {
    return { ...base, ok: false, status: 0, code: "network", totalMs: performance.now() - started };
  }
  if (!res.ok || !spec.stream) {
    const body = await res.text().catch(() => "");
    const totalMs = performance.now() - started;
    if (!res.ok)
      return { ...base, ok: false, status: res.status, code: errorCode(body, res.status), totalMs };
    let tokens = 0;
    try {
      tokens = (JSON.parse(body) as Chunk).usage?.completion_tokens ?? 0;
    } catch {
      return { ...base, ok: false, status: res.status, code: "invalid_json", totalMs };
    }
    return {
      ...base,
      ok: true,
      status: res.status,
      code: null,
      ttftMs: totalMs,
      totalMs,
      outputTokens: tokens,
    };
  }
  let last: number | null = null;
  let events = 0;
  let usageTokens: number | null = null;
  let failure: string | null = null;
  const reader = (res.body ?? new ReadableStream())
    .pipeThrough(new TextDecoderStream())
    .pipeThrough(new EventSourceParserStream())
    .getReader();
  for (;;) {
    const { done, value } = await reader.read().catch(() => ({ done: true, value: undefined }));
    if (done || value === undefined) break;
    if (value.data === "[DONE]") continue;
    let chunk: Chunk;
    try {
      chunk = JSON.parse(value.data) as Chunk;
    } catch {
      continue;
    }
    if (chunk.error) failure = chunk.error.code ?? chunk.error.type ?? "stream_error";
    if (typeof chunk.usage?.completion_tokens === "number")
      usageTokens = chunk.usage.completion_tokens;
    const choice = chunk.choices?.[0];
    const content = choice?.delta?.content ?? choice?.text ?? "";
    if (content === "") continue;
    const now = performance.now();
    if (last === null) base.ttftMs = now - started;
    else base.itlMs.push(now - last);
    last = now;
    events++;
  }
  const totalMs = performance.now() - started;
  return {
    ...base,
    ok: failure === null,
    status: res.status,
    code: failure,
    totalMs,
    outputTokens: usageTokens ?? events,
  };
}
