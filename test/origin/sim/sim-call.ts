/** Calls the simulated engine directly, as the origin's routes do. */
import type { Engine, EngineOutcome } from "../../../origin/engine.ts";
import type { ItemPath } from "../../../contracts/protocol/schema.ts";
import { createSimEngine } from "../../../origin/sim/engine.ts";
import type { SimEngineOptions } from "../../../origin/sim/options.ts";

const decoder = new TextDecoder();
const engines: Engine[] = [];

/** Closes every engine {@link engine} made. */
export async function closeEngines(): Promise<void> {
  await Promise.all(engines.splice(0).map((e) => e.close()));
}

/** A simulated engine without delays, deterministic unless told otherwise. */
export function engine(options: SimEngineOptions = {}): ReturnType<typeof createSimEngine> {
  const e = createSimEngine({ timeScale: 0, deterministic: true, ...options });
  engines.push(e);
  return e;
}

export interface Answer {
  status: number;
  headers: Record<string, string>;
  chunks: string[];
  text: string;
  outcome: EngineOutcome;
}

let nextId = 0;

/** Submits one request and reads the whole answer. */
export async function call(
  e: Engine,
  body: unknown,
  path: ItemPath = "/v1/chat/completions",
  signal = new AbortController().signal,
): Promise<Answer> {
  const response = await e.submit({
    id: `req-${++nextId}`,
    path,
    body: typeof body === "string" ? body : JSON.stringify(body),
    headers: {},
    signal,
    priority: 0,
  });
  const chunks: string[] = [];
  for await (const chunk of response.body) chunks.push(decoder.decode(chunk));
  return {
    status: response.status,
    headers: response.headers,
    chunks,
    text: chunks.join(""),
    outcome: await response.outcome,
  };
}

/** Parsed `data:` payloads of an SSE body, without the `[DONE]` line. */
export function events(answer: Answer): Record<string, unknown>[] {
  return answer.chunks
    .filter((c) => c !== "data: [DONE]\n\n")
    .map((c) => JSON.parse(c.slice("data: ".length)) as Record<string, unknown>);
}

/** The engine's model, a long shared system prompt and a chat request over it. */
export const MODEL = "warmgate-sim-8b";
export const LONG_SYSTEM = "You are the support assistant of a large logistics company. ".repeat(
  30,
);
export const chat = (extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [
    { role: "system", content: LONG_SYSTEM },
    { role: "user", content: "Where is my parcel?" },
  ],
  max_tokens: 64,
  ...extra,
});
