/**
 * Deterministic output for the simulated engine: text, JSON or a tool call, planned
 * token by token from a seeded PRNG before any step runs, so the bytes never depend on
 * timing or cache state.
 * See docs/configuration.md, "The simulated engine".
 */
import { Hasher, Rng, hashHex } from "./hash.ts";
import { VOCAB_SIZE, tokenizeWithText } from "./tokenizer.ts";

/** Built-in vocabulary of generated text (ASCII letters only, so token counts stay exact). */
export const VOCABULARY: readonly string[] = (
  "the of and to in is that for it as with was on be by this are from at or an have not " +
  "which but all they can their has more one will would there been when about other some " +
  "time into only could new these two may first then any like now such over also after " +
  "most where much should well very through what between under while each both those " +
  "cache token batch model region origin stream prefix latency window request response " +
  "memory block engine edge kernel tensor queue budget signal vector layer weight sample " +
  "gradient attention context decode prefill throughput replica cluster router shard " +
  "network packet buffer thread process socket server client header payload channel " +
  "river mountain forest ocean garden valley harbor island meadow desert canyon glacier " +
  "morning evening winter summer autumn spring light shadow silver golden quiet gentle " +
  "bright careful simple steady rapid hidden ancient modern useful distant certain " +
  "build measure compare improve reduce extend observe combine balance predict deliver " +
  "schedule allocate evict preempt recompute stabilize coordinate understand remember " +
  "question answer example detail reason result method system pattern problem solution " +
  "people language history science music theory practice structure surface distance"
).split(" ");

/** Mean natural length (in tokens) before the end-of-sequence token. */
export const MEAN_OUTPUT_TOKENS = 96;

/** Id the planner gives the token that opens a tool call (the function name). */
export const TOOL_CALL_TOKEN = VOCAB_SIZE + 10;

/** What the choice must produce. */
export type OutputMode =
  | { kind: "text" }
  | { kind: "json"; schema: unknown }
  | { kind: "tool"; name: string; parameters: unknown };

/** Inputs of {@link planOutput}. */
export interface PlanOptions {
  /** Seed of this choice (already mixed from the request and the engine seed). */
  seed: number;
  maxTokens: number;
  stop: readonly string[];
  mode: OutputMode;
  /** Keep generating until `maxTokens` (vLLM's `ignore_eos`). */
  ignoreEos: boolean;
}

/** A tool call as the model produced it. */
export interface PlannedToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** The tokens of one choice and how it ends. */
export interface OutputPlan {
  /** Token ids, one per generated token. */
  ids: number[];
  /** Visible text each token adds (after stop-string cutting; may be empty). */
  deltas: string[];
  /** The whole visible text (content, or the tool call's arguments). */
  text: string;
  finishReason: "stop" | "length" | "tool_calls";
  toolCall: PlannedToolCall | null;
}

function capitalize(word: string): string {
  return word.charAt(0).toUpperCase() + word.slice(1);
}

function sentence(rng: Rng): string {
  const words = 6 + rng.int(12);
  let out = "";
  for (let i = 0; i < words; i++) {
    const word = rng.pick(VOCABULARY);
    out += i === 0 ? capitalize(word) : ` ${word}`;
    if (i > 1 && i < words - 2 && rng.float() < 0.08) out += ",";
  }
  return `${out}.`;
}

function phrase(rng: Rng, words: number): string {
  const parts: string[] = [];
  for (let i = 0; i < words; i++) parts.push(rng.pick(VOCABULARY));
  return parts.join(" ");
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A value that fits a JSON schema (types, enums, properties, items), chosen by the PRNG. */
export function valueForSchema(schema: unknown, rng: Rng, depth = 0): unknown {
  if (!isRecord(schema)) return phrase(rng, 2 + rng.int(3));
  const options = schema["enum"];
  if (Array.isArray(options) && options.length > 0) return rng.pick(options);
  if ("const" in schema) return schema["const"];
  const type = Array.isArray(schema["type"]) ? schema["type"][0] : schema["type"];
  switch (type) {
    case "string":
      return phrase(rng, 1 + rng.int(4));
    case "integer":
      return rng.int(1000);
    case "number":
      return Math.round(rng.float() * 100_000) / 100;
    case "boolean":
      return rng.float() < 0.5;
    case "null":
      return null;
    case "array": {
      const count = depth > 2 ? 0 : 1 + rng.int(3);
      return Array.from({ length: count }, () => valueForSchema(schema["items"], rng, depth + 1));
    }
    default: {
      const properties = schema["properties"];
      if (isRecord(properties)) {
        const out: Record<string, unknown> = {};
        for (const [key, sub] of Object.entries(properties)) {
          out[key] = depth > 3 ? null : valueForSchema(sub, rng, depth + 1);
        }
        return out;
      }
      if (type === "object") return {};
      return phrase(rng, 2 + rng.int(3));
    }
  }
}

function freeJson(rng: Rng): Record<string, unknown> {
  const out: Record<string, unknown> = { answer: sentence(rng).slice(0, -1) };
  const extra = 1 + rng.int(3);
  for (let i = 0; i < extra; i++) {
    const key = rng.pick(VOCABULARY);
    const kind = rng.int(3);
    out[key] =
      kind === 0 ? rng.int(10_000) : kind === 1 ? phrase(rng, 2 + rng.int(4)) : [phrase(rng, 2)];
  }
  return out;
}

/** Samples the natural length, heavy-tailed like chat answers, at least a few tokens. */
function naturalLength(rng: Rng): number {
  return 4 + Math.floor(-Math.log(1 - rng.float()) * MEAN_OUTPUT_TOKENS);
}

/** Earliest index where any stop string occurs, searching from `from`; -1 if none. */
function findStop(text: string, stop: readonly string[], from: number): number {
  let best = -1;
  for (const s of stop) {
    if (s.length === 0) continue;
    const at = text.indexOf(s, Math.max(0, from - s.length + 1));
    if (at !== -1 && (best === -1 || at < best)) best = at;
  }
  return best;
}

/** Plans every token of one choice. */
export function planOutput(options: PlanOptions): OutputPlan {
  const rng = new Rng(options.seed);
  const { maxTokens, mode } = options;
  if (mode.kind === "tool") {
    const args = JSON.stringify(valueForSchema(mode.parameters ?? { type: "object" }, rng));
    const tokens = tokenizeWithText(args);
    const room = Math.max(0, maxTokens - 1);
    const kept = tokens.slice(0, room);
    const text = kept.map((t) => t.text).join("");
    const id = `chatcmpl-tool-${hashHex(new Hasher(11).int(options.seed).digest(), 32)}`;
    return {
      ids: [TOOL_CALL_TOKEN, ...kept.map((t) => t.id)],
      deltas: ["", ...kept.map((t) => t.text)],
      text,
      finishReason: kept.length < tokens.length ? "length" : "tool_calls",
      toolCall: { id, name: mode.name, arguments: text },
    };
  }

  let tokens: { text: string; id: number }[];
  let natural: boolean;
  if (mode.kind === "json") {
    const value = mode.schema === null ? freeJson(rng) : valueForSchema(mode.schema, rng);
    tokens = tokenizeWithText(JSON.stringify(value));
    natural = tokens.length <= maxTokens;
  } else {
    // Whole sentences until the sampled length is passed; the answer then ends (EOS).
    const target = options.ignoreEos ? Infinity : naturalLength(rng);
    tokens = [];
    // A sentence ends in "." and the next starts with a space, so tokenizing sentence by
    // sentence gives the same tokens as tokenizing the whole text.
    while (tokens.length < target && tokens.length <= maxTokens) {
      const next = (tokens.length === 0 ? "" : " ") + sentence(rng);
      for (const token of tokenizeWithText(next)) tokens.push(token);
    }
    natural = tokens.length <= maxTokens;
  }
  if (!natural) tokens = tokens.slice(0, maxTokens);

  const ids: number[] = [];
  const raw: string[] = [];
  let text = "";
  let cut = -1;
  for (const token of tokens) {
    const from = text.length;
    text += token.text;
    ids.push(token.id);
    raw.push(token.text);
    cut = findStop(text, options.stop, from);
    if (cut !== -1) break;
  }
  const visible = cut === -1 ? text : text.slice(0, cut);
  // Exact deltas of the visible text: what a stop-string hold-back buffer would release.
  const deltas: string[] = [];
  let at = 0;
  for (const piece of raw) {
    const end = Math.min(at + piece.length, visible.length);
    deltas.push(visible.slice(Math.min(at, visible.length), end));
    at += piece.length;
  }
  return {
    ids,
    deltas,
    text: visible,
    finishReason: cut !== -1 || natural ? "stop" : "length",
    toolCall: null,
  };
}
