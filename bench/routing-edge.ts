/**
 * The through-the-edge part of `npm run bench:routing` (docs/benchmarks.md, "Routing"): the
 * local stack as `npm start -- --origins-per-region 4` runs it, and 40 system prompts of
 * 4,000 tokens × 6 questions, shuffled, sent by 8 clients as a user would send them; with
 * routing off (least-loaded in turn) and on.
 */
import { startStack } from "../scripts/stack.ts";
import { type LatencySummary, summarize } from "./lib.ts";
import { chatBody, hitCeiling, sharedPrefix } from "./routing-workloads.ts";

/** What one run through the edge measured. */
export interface EdgeRun {
  routing: boolean;
  requests: number;
  failures: number;
  hitRate: number;
  ceiling: number;
  /** Requests each origin of the region served, in order. */
  perOrigin: number[];
  /** Each origin's share of the requests. */
  shares: number[];
  /** Engine ms to the first content token. */
  ttft: LatencySummary;
}

const CONCURRENCY = 8;
const TIME_SCALE = 0.5;

export async function runThroughEdge(routing: boolean): Promise<EdgeRun> {
  const stack = await startStack({
    // One region of four origins: the one every local request lands in.
    regions: [{ id: "eu", continents: ["EU", "AF", "NA", "SA", "AS", "OC", "AN"], origins: 4 }],
    sim: { timeScale: TIME_SCALE },
    settings: { routing: { enabled: routing } },
  });
  try {
    const workload = sharedPrefix(40, 6, 4_000);
    const bodies = workload.sessions.map((s) => chatBody(s, s.turn(0, [])));
    const served = new Map<string, number>();
    const ttfts: number[] = [];
    let prompt = 0;
    let cached = 0;
    let failures = 0;
    let next = 0;
    const client = async () => {
      for (let i = next++; i < bodies.length; i = next++) {
        const started = performance.now();
        const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
          body: bodies[i],
        });
        const origin = res.headers.get("x-warmgate-origin") ?? "?";
        served.set(origin, (served.get(origin) ?? 0) + 1);
        const text = await readStream(res, () =>
          ttfts.push((performance.now() - started) / TIME_SCALE),
        );
        const usage = usageOf(text);
        if (!res.ok || usage === null) {
          failures += 1;
          continue;
        }
        prompt += usage.prompt_tokens;
        cached += usage.prompt_tokens_details?.cached_tokens ?? 0;
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, client));
    const ids = Array.from({ length: 4 }, (_, i) => `eu-${i + 1}`);
    const perOrigin = ids.map((id) => served.get(id) ?? 0);
    return {
      routing,
      requests: bodies.length,
      failures,
      hitRate: prompt === 0 ? 0 : cached / prompt,
      ceiling: hitCeiling(bodies.map((body) => ({ body, answer: "" }))),
      perOrigin,
      shares: perOrigin.map((n) => n / bodies.length),
      ttft: summarize(ttfts),
    };
  } finally {
    await stack.stop();
  }
}

/** Reads an SSE answer whole, calling `first` at its first content token. */
async function readStream(res: Response, first: () => void): Promise<string> {
  if (res.body === null) return "";
  const decoder = new TextDecoder();
  let text = "";
  let seen = false;
  const reader = res.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
    if (!seen && text.includes('"content":"')) {
      seen = true;
      first();
    }
  }
  return text;
}

interface Usage {
  prompt_tokens: number;
  prompt_tokens_details?: { cached_tokens?: number };
}

/** The usage of an SSE answer's last chunk that has one. */
function usageOf(text: string): Usage | null {
  let usage: Usage | null = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: {")) continue;
    const chunk = JSON.parse(line.slice(6)) as { usage?: Usage | null };
    if (chunk.usage) usage = chunk.usage;
  }
  return usage;
}
