/**
 * A tokenizer stand-in with GPT-like token counts for any UTF-8 text.
 *
 * Pre-tokenization follows cl100k's shape (contractions, words with their leading
 * space, numbers in groups of 1–3 digits, punctuation runs, whitespace); then ASCII runs
 * split every 4 characters, each CJK, kana or hangul character is one token, and other
 * non-ASCII text costs one token per 2 UTF-8 bytes. Ids come from a hash of the piece.
 * See docs/configuration.md, "The simulated engine".
 */
import { hashString } from "./hash.ts";

/** Size of the id space of ordinary tokens; special tokens live above it. */
export const VOCAB_SIZE = 100_000;

// `\s+(?!\S)` leaves the last space of a run to the word after it, as GPT tokenizers do.
const PRETOKENIZE =
  /'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])| ?[\p{L}\p{M}]+|\p{N}{1,3}| ?[^\s\p{L}\p{M}\p{N}]+|\s+(?!\S)|\s+/gu;

const ASCII_CHUNK = 4;

/** One token: the text it stands for (may be empty when a token splits a character) and its id. */
export interface Token {
  text: string;
  id: number;
}

function isWideChar(cp: number): boolean {
  return (
    (cp >= 0x1100 && cp <= 0x11ff) || // hangul jamo
    (cp >= 0x3000 && cp <= 0x30ff) || // CJK punctuation, hiragana, katakana
    (cp >= 0x3130 && cp <= 0x318f) || // hangul compatibility jamo
    (cp >= 0x31f0 && cp <= 0x31ff) ||
    (cp >= 0x3400 && cp <= 0x4dbf) ||
    (cp >= 0x4e00 && cp <= 0x9fff) ||
    (cp >= 0xac00 && cp <= 0xd7af) || // hangul syllables
    (cp >= 0xf900 && cp <= 0xfaff) ||
    (cp >= 0xff00 && cp <= 0xffef) || // full- and half-width forms
    (cp >= 0x20000 && cp <= 0x3ffff)
  );
}

function utf8Length(cp: number): number {
  if (cp < 0x80) return 1;
  if (cp < 0x800) return 2;
  if (cp < 0x10000) return 3;
  return 4;
}

function tokenId(text: string, salt: number): number {
  return hashString(text, salt) % VOCAB_SIZE;
}

function splitPiece(piece: string, out: Token[]): void {
  let ascii = "";
  let asciiLimit = ASCII_CHUNK + (piece.startsWith(" ") ? 1 : 0);
  let otherText = "";
  let otherBytes = 0;
  const flushAscii = (): void => {
    if (ascii.length > 0) out.push({ text: ascii, id: tokenId(ascii, 1) });
    ascii = "";
    asciiLimit = ASCII_CHUNK;
  };
  const flushOther = (): void => {
    // An odd byte left over still costs a whole token; its character's text went out already.
    if (otherBytes % 2 === 1) out.push({ text: "", id: tokenId(`${otherText}#end`, 3) });
    otherText = "";
    otherBytes = 0;
  };
  for (const char of piece) {
    const cp = char.codePointAt(0) ?? 0;
    if (cp < 0x80) {
      flushOther();
      ascii += char;
      if (ascii.length >= asciiLimit) flushAscii();
    } else if (isWideChar(cp)) {
      flushAscii();
      flushOther();
      out.push({ text: char, id: tokenId(char, 2) });
    } else {
      flushAscii();
      const before = otherBytes;
      otherBytes += utf8Length(cp);
      otherText += char;
      // One token per completed byte pair; the text rides on the first token it starts.
      let tokens = Math.floor(otherBytes / 2) - Math.floor(before / 2);
      let text = char;
      while (tokens-- > 0) {
        out.push({ text, id: tokenId(`${otherText}#${otherBytes - tokens}`, 3) });
        text = "";
      }
      if (otherBytes % 2 === 0) otherText = "";
    }
  }
  flushAscii();
  flushOther();
}

/** Splits text into tokens with the text each one covers; concatenated texts give back the input. */
export function tokenizeWithText(text: string): Token[] {
  const out: Token[] = [];
  for (const match of text.matchAll(PRETOKENIZE)) splitPiece(match[0], out);
  return out;
}

/** Token ids of `text`. */
export function tokenize(text: string): number[] {
  return tokenizeWithText(text).map((token) => token.id);
}

/** Number of tokens in `text`. */
export function countTokens(text: string): number {
  return tokenizeWithText(text).length;
}
