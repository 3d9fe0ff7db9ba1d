/**
 * Log probabilities of the simulated engine's tokens (docs/configuration.md, "The
 * simulated engine"): a deterministic value per token and position, the sampled token
 * always the most likely, alternatives from the vocabulary, in OpenAI's chat and
 * completions shapes.
 */
import { Hasher, Rng } from "./hash.ts";
import { VOCABULARY } from "./generate.ts";

const encoder = new TextEncoder();

/** One token with its log probability (chat's `logprobs.content[]` entry, less the list). */
export interface TokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
}

/** A chat `logprobs.content[]` entry. */
export interface ChatTokenLogprob extends TokenLogprob {
  top_logprobs: TokenLogprob[];
}

function entry(token: string, logprob: number): TokenLogprob {
  return { token, logprob: Math.round(logprob * 1e6) / 1e6, bytes: [...encoder.encode(token)] };
}

/**
 * The token at `position` of a choice seeded `seed`, and its `top` most likely
 * alternatives (the token itself first), in decreasing probability.
 */
export function tokenLogprobs(
  seed: number,
  position: number,
  token: string,
  top: number,
): ChatTokenLogprob {
  const rng = new Rng(new Hasher(0x6c70).int(seed).int(position).digest());
  // The sampled token is the likeliest: a probability from 0.35 to 1.
  let logprob = Math.log(0.35 + 0.65 * rng.float());
  const chosen = entry(token, logprob);
  const alternatives: TokenLogprob[] = [chosen];
  const seen = new Set([token]);
  while (alternatives.length < top) {
    const word = rng.pick(VOCABULARY);
    const candidate = (token.startsWith(" ") ? " " : "") + word;
    if (seen.has(candidate)) continue;
    seen.add(candidate);
    logprob -= 0.2 + 2 * rng.float();
    alternatives.push(entry(candidate, logprob));
  }
  return { ...chosen, top_logprobs: alternatives.slice(0, top) };
}

/** Chat's `choices[].logprobs` for the given tokens. */
export function chatLogprobs(entries: ChatTokenLogprob[]): {
  content: ChatTokenLogprob[];
  refusal: null;
} {
  return { content: entries, refusal: null };
}

/** Completions' `choices[].logprobs` for tokens starting at `offset` characters. */
export function completionLogprobs(
  entries: (ChatTokenLogprob | { token: string; logprob: null; top_logprobs: null })[],
  offset: number,
): {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
} {
  const textOffset: number[] = [];
  let at = offset;
  for (const e of entries) {
    textOffset.push(at);
    at += e.token.length;
  }
  return {
    tokens: entries.map((e) => e.token),
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) =>
      e.top_logprobs === null
        ? null
        : Object.fromEntries(e.top_logprobs.map((t) => [t.token, t.logprob])),
    ),
    text_offset: textOffset,
  };
}

/** What a choice's log probabilities come from. */
export interface LogprobSource {
  /** The choice's seed. */
  seed: number;
  /** Visible text of each generated token. */
  deltas: readonly string[];
}

/** Entries of the generated tokens `from` to `to` that show text. */
export function generatedEntries(
  source: LogprobSource,
  top: number,
  from = 0,
  to = source.deltas.length,
): ChatTokenLogprob[] {
  const out: ChatTokenLogprob[] = [];
  for (let i = from; i < to; i++) {
    const text = source.deltas[i] ?? "";
    if (text !== "") out.push(tokenLogprobs(source.seed, i, text, top));
  }
  return out;
}

/** Entries of an echoed prompt: the first token has no log probability, as in OpenAI's. */
export function promptEntries(
  tokens: readonly string[],
  seed: number,
  top: number,
): (ChatTokenLogprob | { token: string; logprob: null; top_logprobs: null })[] {
  return tokens.map((token, i) =>
    i === 0
      ? { token, logprob: null, top_logprobs: null }
      : tokenLogprobs(seed ^ 0x7072, i, token, top),
  );
}
