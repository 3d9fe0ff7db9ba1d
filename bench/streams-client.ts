/**
 * One streamed chat completion as `npm run bench:streams` reads it (docs/benchmarks.md,
 * "Streams under load"): each read the client makes, how many content tokens it carried,
 * the gaps between the reads that carried any, and the time to the first content token.
 */

/** How one stream read. */
export interface StreamSample {
  /** ms from sending to the first read that carried a content token. */
  ttftMs: number;
  totalMs: number;
  /** Content tokens (SSE events with non-empty `delta.content`). */
  tokens: number;
  /** Reads that carried at least one content token. */
  tokenReads: number;
  /** ms between consecutive reads that carried content tokens. */
  gapsMs: number[];
}

interface ChatChunk {
  choices?: { delta?: { content?: string | null } }[];
}

/** Content tokens in the complete SSE events of `events` (the text between blank lines). */
function contentEvents(events: readonly string[]): number {
  let tokens = 0;
  for (const event of events) {
    for (const line of event.split("\n")) {
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      try {
        const content = (JSON.parse(line.slice(6)) as ChatChunk).choices?.[0]?.delta?.content;
        if (typeof content === "string" && content !== "") tokens += 1;
      } catch {
        // Not a JSON event: not a token.
      }
    }
  }
  return tokens;
}

/**
 * POSTs a streamed chat completion and reads it as a client does, one read at a time;
 * throws unless a 200 that ends with `[DONE]`. An event split across reads counts in the
 * read that completes it.
 */
export async function readStream(
  url: string,
  headers: Record<string, string>,
  body: string,
): Promise<StreamSample> {
  const started = performance.now();
  const res = await fetch(url, { method: "POST", headers, body });
  const reader = res.body?.getReader();
  if (reader === undefined) throw new Error(`status ${res.status}: no body`);
  const decoder = new TextDecoder();
  let pending = "";
  let tail = "";
  let ttftMs = Number.NaN;
  let tokens = 0;
  let tokenReads = 0;
  let lastTokenRead: number | null = null;
  const gapsMs: number[] = [];
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const at = performance.now();
    pending += decoder.decode(value, { stream: true });
    const cut = pending.lastIndexOf("\n\n");
    if (cut < 0) continue;
    const complete = pending.slice(0, cut).split("\n\n");
    pending = pending.slice(cut + 2);
    tail = (tail + complete.join("\n\n")).slice(-64);
    const carried = contentEvents(complete);
    if (carried === 0) continue;
    tokens += carried;
    tokenReads += 1;
    if (lastTokenRead === null) ttftMs = at - started;
    else gapsMs.push(at - lastTokenRead);
    lastTokenRead = at;
  }
  const totalMs = performance.now() - started;
  if (res.status !== 200 || !tail.endsWith("data: [DONE]")) {
    throw new Error(`status ${res.status}: ended with ${JSON.stringify(tail.slice(-40))}`);
  }
  return { ttftMs, totalMs, tokens, tokenReads, gapsMs };
}
