/**
 * The workloads of `npm run bench:routing` (docs/benchmarks.md, "Routing"): groups of
 * requests sharing long system prompts, multi-turn sessions whose history grows, agents on
 * one system prompt, retrieval over more documents than one cache holds, a few very hot
 * prefixes, and unique prompts; and the token hit rate each could reach if every prefix
 * were prefilled once (an unbounded cache, in the engine's own tokens, answers included).
 */
import { DEFAULT_SIM_MODELS } from "../origin/sim/options.ts";
import { chainBlockHash } from "../origin/sim/kv-cache.ts";
import { parseRequest } from "../origin/sim/request.ts";
import { tokenize } from "../origin/sim/tokenizer.ts";

export const MODEL = "warmgate-sim-8b";
/** The engine's KV block size. */
const BLOCK = 16;

/** A chat message. */
export interface Message {
  role: string;
  content: string;
}

/** One conversation: its turns leave one after another, each with the answers before it. */
export interface Session {
  /** Sent as the OpenAI `user` field (multi-turn sessions only). */
  user: string | null;
  maxTokens: number;
  /** The messages of turn `turn`, given the conversation so far. */
  turn(turn: number, history: readonly Message[]): Message[];
  turns: number;
}

/** A workload: its sessions, in arrival order. */
export interface Workload {
  name: "shared-prefix" | "multi-turn" | "hot-prefix" | "uniform" | "agents" | "rag" | "hot-few";
  sessions: Session[];
}

const WORDS = (
  "account billing invoice refund policy customer order shipping warehouse delivery " +
  "schedule contract renewal discount premium support ticket escalation region latency " +
  "capacity forecast quarter revenue margin audit compliance security privacy retention"
).split(" ");

/** Deterministic text of about `tokens` engine tokens, distinct per `seed` from its start. */
export function text(tokens: number, seed: number): string {
  let out = `Document ${seed}. `;
  let state = seed * 2654435761;
  // About two engine tokens per word (pieces of four characters, plus its space).
  for (let i = 0; out.length < tokens * 3.87; i++) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    out += `${WORDS[state % WORDS.length] ?? "x"} `;
  }
  return out;
}

function shuffle<T>(items: T[], seed: number): T[] {
  let state = seed;
  for (let i = items.length - 1; i > 0; i--) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    const j = state % (i + 1);
    const a = items[i];
    const b = items[j];
    if (a === undefined || b === undefined) continue;
    items[i] = b;
    items[j] = a;
  }
  return items;
}

function single(messages: Message[], maxTokens: number): Session {
  return { user: null, maxTokens, turns: 1, turn: () => messages };
}

/** `groups` system prompts of `tokens` tokens, `questions` short questions each, shuffled. */
export function sharedPrefix(groups = 40, questions = 6, tokens = 4_000): Workload {
  const sessions: Session[] = [];
  for (let g = 0; g < groups; g++) {
    const system = text(tokens, g);
    for (let q = 0; q < questions; q++) {
      const ask = `Question ${q} for group ${g}: what applies to order ${g * 31 + q}?`;
      sessions.push(
        single(
          [
            { role: "system", content: system },
            { role: "user", content: ask },
          ],
          16,
        ),
      );
    }
  }
  return { name: "shared-prefix", sessions: shuffle(sessions, 7) };
}

/** `count` conversations of `turns` turns over a shared-size system prompt of their own. */
export function multiTurn(count = 24, turns = 6, tokens = 2_000): Workload {
  const sessions = Array.from({ length: count }, (_, s): Session => {
    const system = text(tokens, 1_000 + s);
    return {
      user: `user-${s}`,
      maxTokens: 24,
      turns,
      turn: (turn, history) => [
        ...(history.length === 0 ? [{ role: "system", content: system }] : history),
        { role: "user", content: `Turn ${turn} of conversation ${s}: ${text(60, s * 10 + turn)}` },
      ],
    };
  });
  return { name: "multi-turn", sessions };
}

/** `hot` prefixes take `share` of `count` requests; the rest have unique prompts. */
export function hotPrefix(
  count = 240,
  hot = 2,
  share = 0.85,
  tokens = 4_000,
  maxTokens = 96,
): Workload {
  const prefixes = Array.from({ length: hot }, (_, h) => text(tokens, 5_000 + h));
  const sessions: Session[] = [];
  for (let i = 0; i < count; i++) {
    const isHot = (i * 7919) % 100 < share * 100;
    const system = isHot ? (prefixes[i % hot] ?? "") : text(tokens, 6_000 + i);
    const ask = `Request ${i}: summarise the terms for account ${i}.`;
    sessions.push(
      single(
        [
          { role: "system", content: system },
          { role: "user", content: ask },
        ],
        maxTokens,
      ),
    );
  }
  return { name: "hot-prefix", sessions };
}

/**
 * `count` agents on one system prompt of `tokens` tokens, none sending a session: each runs
 * `turns` steps, re-sending its whole conversation with a tool result of its own each time.
 */
export function agents(count = 48, turns = 8, tokens = 1_500): Workload {
  const system = text(tokens, 2_000);
  const sessions = Array.from({ length: count }, (_, a): Session => ({
    user: null,
    maxTokens: 48,
    turns,
    turn: (turn, history) => [
      ...(history.length === 0 ? [{ role: "system", content: system }] : history),
      {
        role: "user",
        content: `Agent ${a}, step ${turn}, tool result: ${text(160, a * 100 + turn)}`,
      },
    ],
  }));
  return { name: "agents", sessions };
}

/**
 * Retrieval: `count` questions, each over one of `apps` system prompts and one of `documents`
 * documents of `tokens` tokens (each document belongs to one app), drawn with repeats, so
 * that the documents together hold more tokens than one origin's cache.
 */
export function rag(count = 600, documents = 96, apps = 3, tokens = 2_000): Workload {
  const systems = Array.from({ length: apps }, (_, s) => text(600, 3_000 + s));
  const docs = Array.from({ length: documents }, (_, d) => text(tokens, 4_000 + d));
  const sessions: Session[] = [];
  let state = 17;
  for (let i = 0; i < count; i++) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    // The high bits: an LCG's low bits repeat with a short period.
    const d = (state >>> 16) % documents;
    sessions.push(
      single(
        [
          { role: "system", content: systems[d % apps] ?? "" },
          { role: "user", content: `Context:\n${docs[d] ?? ""}\nQuestion ${i}: what does it say?` },
        ],
        32,
      ),
    );
  }
  return { name: "rag", sessions };
}

/**
 * `hot` prefixes of `tokens` tokens take `share` of `count` requests with long answers, so
 * that each alone keeps more than one origin's sequences busy at the bench's top rate.
 */
export function hotFew(count = 480, hot = 2, share = 0.9, tokens = 2_000): Workload {
  return { ...hotPrefix(count, hot, share, tokens, 256), name: "hot-few" };
}

/** `count` unique prompts of `tokens` tokens: nothing to share. */
export function uniform(count = 240, tokens = 1_500): Workload {
  const sessions = Array.from({ length: count }, (_, i) =>
    single([{ role: "user", content: text(tokens, 9_000 + i) }], 64),
  );
  return { name: "uniform", sessions };
}

/** A fixed sequence in (0, 1): the Poisson arrivals of every policy and of the bench's model. */
export function fraction(i: number): number {
  const x = Math.sin(i * 12.9898 + 78.233) * 43758.5453;
  return Math.min(0.999_999, Math.max(1e-6, x - Math.floor(x)));
}

/** A chat body as the bench sends it. */
export function chatBody(session: Session, messages: readonly Message[]): string {
  return JSON.stringify({
    model: MODEL,
    messages,
    max_tokens: session.maxTokens,
    stream: true,
    stream_options: { include_usage: true },
    ...(session.user !== null && { user: session.user }),
  });
}

/** A request as sent, with the text of its answer (empty when it has none). */
export interface Sent {
  body: string;
  answer: string;
}

/**
 * The hit rate an unbounded cache that every request reaches would give the requests, in
 * the order sent: each prompt's leading full blocks seen before, in an earlier prompt or
 * an earlier answer (an engine caches the blocks it generates), over all prompt tokens.
 */
export function hitCeiling(sent: readonly Sent[]): number {
  const seen = new Set<number>();
  let prompt = 0;
  let cached = 0;
  for (const { body, answer } of sent) {
    const parsed = parseRequest("/v1/chat/completions", body, DEFAULT_SIM_MODELS);
    if (!parsed.ok) continue;
    const tokens = parsed.request.prompts[0] ?? [];
    prompt += tokens.length;
    let parent = 0;
    let hits = true;
    const usable = Math.floor(Math.max(0, tokens.length - 1) / BLOCK);
    for (let end = BLOCK; end <= tokens.length; end += BLOCK) {
      parent = chainBlockHash(parent, MODEL, tokens, end - BLOCK, end);
      if (hits && end / BLOCK <= usable && seen.has(parent)) cached += BLOCK;
      else hits = false;
      seen.add(parent);
    }
    if (answer === "") continue;
    // The answer's blocks, as the engine computed them behind the prompt.
    const whole = [...tokens, ...tokenize(answer)];
    const from = Math.floor(tokens.length / BLOCK) * BLOCK;
    for (let end = from + BLOCK; end <= whole.length - 1; end += BLOCK) {
      parent = chainBlockHash(parent, MODEL, whole, end - BLOCK, end);
      seen.add(parent);
    }
  }
  return prompt === 0 ? 0 : cached / prompt;
}
