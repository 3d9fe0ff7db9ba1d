/**
 * API keys (docs/edge.md): `wg_<id>_<secret><check>`, where `id` (80 random bits) names the
 * key's KeyAccount, `secret` holds 128 random bits, and `check` is the first 40 bits of an
 * HMAC over the rest under the edge's signing secret, so malformed and forged keys are
 * refused without calling a Durable Object. Only the SHA-256 of the whole key is stored,
 * and no function here logs or echoes a key.
 */
import { missingSecret } from "../deployment.ts";
import { base32, constantTimeEqual, hmacSha256, sha256Hex } from "../../contracts/hashing.ts";

/** The prefix every API key starts with. */
export const API_KEY_PREFIX = "wg_";

/** Shape of an API key id. */
export const KEY_ID_PATTERN = /^[a-z2-7]{16}$/;

const API_KEY_PATTERN = /^wg_([a-z2-7]{16})_([a-z2-7]{26})([a-z2-7]{8})$/;
const KEY_CHECK_LABEL = "warmgate/api-key-check/v1";

/** A key that passed the edge's format and check: its id and the hash the KeyAccount compares. */
export interface ParsedApiKey {
  keyId: string;
  secretHash: string;
}

/** The secrets the edge signs with; `TOKEN_SIGNING_SECRET` falls back to `ADMIN_TOKEN`. */
export interface SigningEnv {
  ADMIN_TOKEN?: string;
  TOKEN_SIGNING_SECRET?: string;
}

/**
 * The edge's signing secret. Prefer `TOKEN_SIGNING_SECRET`: without it the admin token
 * signs key checks and browser tokens, so changing the admin token invalidates every key.
 */
export function signingSecret(env: SigningEnv): string {
  const secret = env.TOKEN_SIGNING_SECRET ?? env.ADMIN_TOKEN;
  if (secret === undefined || secret === "") throw missingSecret("TOKEN_SIGNING_SECRET");
  return secret;
}

/** A subkey of the signing secret for one purpose, so keys and tokens never share a key. */
export async function deriveSecret(env: SigningEnv, label: string): Promise<Uint8Array> {
  return hmacSha256(signingSecret(env), label);
}

/** A new random key id. */
export function newKeyId(): string {
  return base32(crypto.getRandomValues(new Uint8Array(10)));
}

/** Mints a new API key for `keyId`: the full key (shown once) and its stored hash. */
export async function mintApiKey(
  env: SigningEnv,
  keyId: string,
  memo: ApiKeyMemo = new ApiKeyMemo(),
): Promise<{ key: string; secretHash: string }> {
  const body = `${API_KEY_PREFIX}${keyId}_${base32(crypto.getRandomValues(new Uint8Array(16)))}`;
  const key = body + (await keyCheck(env, body, memo));
  return { key, secretHash: await sha256Hex(key) };
}

/** How many checked keys an isolate remembers (see {@link parseApiKey}). */
export const CHECKED_KEYS_CACHED = 1_024;

type CheckedKey = { ok: true; parsed: ParsedApiKey } | { ok: false };

/** What an isolate remembers of API keys, by signing secret (see {@link parseApiKey}). */
export class ApiKeyMemo {
  /**
   * Keys already checked, most recently used last. The check and hash depend only on the
   * key and the secret, so a remembered answer is the answer; revocation and expiry are the
   * KeyAccount's business, asked on every request anyway.
   */
  readonly checked = new Map<string, Map<string, CheckedKey>>();
  /** Derived check keys: one derivation per isolate, not per request. */
  readonly checkKeys = new Map<string, Promise<CryptoKey>>();
}

/**
 * Parses and checks an API key at the edge; null for anything malformed or forged.
 * Answers for recently seen well-formed keys come from a per-isolate cache (an HMAC and
 * a SHA-256 less per request).
 */
export async function parseApiKey(
  env: SigningEnv,
  key: string,
  memo: ApiKeyMemo,
): Promise<ParsedApiKey | null> {
  const match = API_KEY_PATTERN.exec(key);
  if (match === null) return null;
  const [, keyId, secret, check] = match;
  if (keyId === undefined || secret === undefined || check === undefined) return null;
  const signing = signingSecret(env);
  let cache = memo.checked.get(signing);
  if (cache === undefined) {
    cache = new Map();
    memo.checked.set(signing, cache);
  }
  const known = cache.get(key);
  if (known !== undefined) {
    // Refresh its place, so a busy key is the last to be forgotten.
    cache.delete(key);
    cache.set(key, known);
    return known.ok ? known.parsed : null;
  }
  const expected = await keyCheck(env, `${API_KEY_PREFIX}${keyId}_${secret}`, memo);
  const checked: CheckedKey = constantTimeEqual(expected, check)
    ? { ok: true, parsed: { keyId, secretHash: await sha256Hex(key) } }
    : { ok: false };
  cache.set(key, checked);
  if (cache.size > CHECKED_KEYS_CACHED) {
    const oldest = cache.keys().next();
    if (oldest.done !== true) cache.delete(oldest.value);
  }
  return checked.ok ? checked.parsed : null;
}

/** The bearer credential of an `Authorization` header, or null when there is none. */
export function bearerToken(header: string | null | undefined): string | null {
  if (header === null || header === undefined) return null;
  const match = /^Bearer[ ]+(\S+)\s*$/i.exec(header);
  return match?.[1] ?? null;
}

async function keyCheck(env: SigningEnv, body: string, memo: ApiKeyMemo): Promise<string> {
  const secret = signingSecret(env);
  let key = memo.checkKeys.get(secret);
  if (key === undefined) {
    key = deriveSecret(env, KEY_CHECK_LABEL).then((raw) =>
      crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]),
    );
    memo.checkKeys.set(secret, key);
  }
  const mac = await crypto.subtle.sign("HMAC", await key, new TextEncoder().encode(body));
  return base32(new Uint8Array(mac).subarray(0, 5));
}
