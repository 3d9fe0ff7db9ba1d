/**
 * Browser tokens (docs/edge.md, "Browser tokens and CORS"): short-lived HS256 JWTs that a
 * customer's backend mints with its API key, naming the key, an optional end user, narrowed
 * limits and models, the key's allowed origins and the generation of the key secret that
 * minted it (the token ends with that secret); verified at the edge with no storage lookup.
 * A preflight is allowed for an Origin some active key allows (the KeyDirectory); the actual
 * request is refused unless its token's and key's origins include it. The routes that mint
 * tokens and answer preflights are routes/tokens.ts.
 */
import { sign, verify } from "hono/jwt";
import type { Limits } from "../../durable-objects/key-account/types.ts";
import type { PeriodBudget } from "../../durable-objects/key-account/budget-types.ts";
import { isBudgetPeriod } from "../../contracts/budget-periods.ts";
import { z } from "zod";
import { DIRECTORY_NAME } from "../../durable-objects/key-directory/types.ts";
import { hex } from "../../contracts/hashing.ts";
import { KEY_ID_PATTERN, deriveSecret, signingSecret, type SigningEnv } from "./keys.ts";

/** The `aud` and `iss` of every browser token. */
export const TOKEN_AUDIENCE = "warmgate";

/** The longest lifetime a browser token may have. */
export const MAX_TOKEN_TTL_SECONDS = 3_600;

/** Lifetime of a browser token when the request names none. */
export const DEFAULT_TOKEN_TTL_SECONDS = 900;

/** How long browsers may cache a preflight answer. */
export const CORS_MAX_AGE_SECONDS = 600;

const TOKEN_LABEL = "warmgate/browser-token/v1";
// Tolerated difference between the minting and the verifying clock for `nbf` and `iat`.
const CLOCK_SKEW_SECONDS = 30;
// Preflight answers cached per isolate, so preflights rarely reach the directory.
const PREFLIGHT_CACHE_MS = 30_000;
const PREFLIGHT_CACHE_SIZE = 1_000;

/** What an isolate remembers for browser tokens and CORS preflights. */
export class BrowserTokenMemo {
  /** Preflight answers by Origin, so preflights rarely reach the directory. */
  readonly preflights = new Map<string, { allowed: boolean; until: number }>();
  /** The HS256 secret per signing secret, derived once per isolate. */
  readonly secrets = new Map<string, Promise<string>>();
}

const EXPOSED_HEADERS = [
  "x-request-id",
  "x-ratelimit-limit-requests",
  "x-ratelimit-remaining-requests",
  "x-ratelimit-reset-requests",
  "x-ratelimit-limit-tokens",
  "x-ratelimit-remaining-tokens",
  "x-ratelimit-reset-tokens",
  "retry-after",
  "retry-after-ms",
  "x-warmgate-region",
  "x-warmgate-origin",
  "x-warmgate-cost-usd",
  "x-warmgate-attempts",
  "x-warmgate-cache",
].join(", ");

/** The limits a browser token carries (each at most its key's). */
export const LimitsClaim = z.strictObject({
  rpm: z.int().positive(),
  tpm: z.int().positive(),
  concurrency: z.int().positive(),
});

/** An end user's budgets as a token carries them: [period, whole micro-dollars]. */
const BudgetsClaim = z
  .array(z.tuple([z.string().refine(isBudgetPeriod), z.int().min(0).max(1e15)]))
  .max(8);

const BrowserTokenClaims = z.object({
  iss: z.literal(TOKEN_AUDIENCE),
  aud: z.literal(TOKEN_AUDIENCE),
  sub: z.string().regex(KEY_ID_PATTERN),
  jti: z.string().min(8).max(64),
  iat: z.int(),
  nbf: z.int(),
  exp: z.int(),
  gen: z.int().positive(),
  user: z.string().min(1).max(256).optional(),
  lim: LimitsClaim,
  mdl: z.array(z.string()).nullable(),
  org: z.array(z.string()),
  bdg: BudgetsClaim.optional(),
});

/** What a verified browser token grants. */
export interface BrowserScope {
  keyId: string;
  /** The end user the token was minted for, or null. */
  user: string | null;
  /** Whose per-end-user limits apply: the user, or this one token when it names none. */
  subject: string;
  limits: Limits;
  /** Models the token may call, or null for every model the key allows. */
  models: string[] | null;
  /** Browser origins the token may be used from. */
  origins: string[];
  /** The end user's own budgets (spend is kept per end user, across their tokens). */
  budgets: PeriodBudget[];
  /** Epoch ms at which the token expires. */
  expiresAt: number;
  /** The generation of the key secret that minted it; the KeyAccount ends it with that secret. */
  secretGeneration: number;
}

/** What to put in a new browser token. */
export interface MintBrowserTokenInput {
  keyId: string;
  /** The generation of the key secret minting it (what the key's account answered). */
  secretGeneration: number;
  user: string | null;
  limits: Limits;
  models: string[] | null;
  origins: string[];
  budgets: PeriodBudget[];
  ttlSeconds: number;
  now: number;
}

/** Signs a browser token; `expiresAt` is in unix seconds. */
export async function mintBrowserToken(
  env: SigningEnv,
  input: MintBrowserTokenInput,
  memo: BrowserTokenMemo = new BrowserTokenMemo(),
): Promise<{ token: string; expiresAt: number }> {
  const iat = Math.floor(input.now / 1_000);
  const exp = iat + Math.min(MAX_TOKEN_TTL_SECONDS, Math.max(1, Math.floor(input.ttlSeconds)));
  const claims: z.infer<typeof BrowserTokenClaims> = {
    iss: TOKEN_AUDIENCE,
    aud: TOKEN_AUDIENCE,
    sub: input.keyId,
    jti: hex(crypto.getRandomValues(new Uint8Array(12))),
    iat,
    nbf: iat,
    exp,
    gen: input.secretGeneration,
    ...(input.user === null ? {} : { user: input.user }),
    lim: input.limits,
    mdl: input.models,
    org: input.origins,
    ...(input.budgets.length > 0 && {
      bdg: input.budgets.map((budget): [string, number] => [budget.period, budget.limitMicros]),
    }),
  };
  return { token: await sign(claims, await tokenSecret(env, memo), "HS256"), expiresAt: exp };
}

/** Verifies a browser token's signature, audience, issuer, `nbf` and `exp` at `now`; null if any fails. */
export async function verifyBrowserToken(
  env: SigningEnv,
  token: string,
  now: number,
  memo: BrowserTokenMemo,
): Promise<BrowserScope | null> {
  let payload: unknown;
  try {
    // hono/jwt checks the signature, `alg`, `aud` and `iss`; times are checked below
    // against `now` so that every claim is required, not only checked when present.
    payload = await verify(token, await tokenSecret(env, memo), {
      alg: "HS256",
      aud: TOKEN_AUDIENCE,
      iss: TOKEN_AUDIENCE,
      exp: false,
      nbf: false,
      iat: false,
    });
  } catch {
    // Its errors quote the token; none of that may reach a log or a response.
    return null;
  }
  const claims = BrowserTokenClaims.safeParse(payload);
  if (!claims.success) return null;
  const { sub, jti, iat, nbf, exp, gen, user, lim, mdl, org, bdg } = claims.data;
  const seconds = now / 1_000;
  if (exp <= seconds || nbf > seconds + CLOCK_SKEW_SECONDS || iat > seconds + CLOCK_SKEW_SECONDS) {
    return null;
  }
  if (exp - iat > MAX_TOKEN_TTL_SECONDS) return null;
  return {
    keyId: sub,
    user: user ?? null,
    subject: user === undefined ? `token:${jti}` : `user:${user}`,
    limits: lim,
    models: mdl,
    origins: org,
    budgets: (bdg ?? []).map(([period, limitMicros]) => ({
      period,
      limitMicros,
      softMicros: null,
    })),
    expiresAt: exp * 1_000,
    secretGeneration: gen,
  };
}

/** Headers that grant `origin` access to a response and expose the rate-limit headers. */
export function corsHeaders(origin: string): Record<string, string> {
  return {
    "access-control-allow-origin": origin,
    "access-control-expose-headers": EXPOSED_HEADERS,
    vary: "Origin",
  };
}

/** Whether any active key allows `origin`; answers preflights. */
export async function originAllowedByAnyKey(
  env: Env,
  origin: string,
  now: number,
  memo: BrowserTokenMemo,
): Promise<boolean> {
  const cached = memo.preflights.get(origin);
  if (cached !== undefined && cached.until > now) return cached.allowed;
  const directory = env.KEY_DIRECTORY.get(env.KEY_DIRECTORY.idFromName(DIRECTORY_NAME));
  const allowed = await directory.originAllowed(origin, now);
  if (memo.preflights.size >= PREFLIGHT_CACHE_SIZE) memo.preflights.clear();
  memo.preflights.set(origin, { allowed, until: now + PREFLIGHT_CACHE_MS });
  return allowed;
}

async function tokenSecret(env: SigningEnv, memo: BrowserTokenMemo): Promise<string> {
  const secret = signingSecret(env);
  let derived = memo.secrets.get(secret);
  if (derived === undefined) {
    derived = deriveSecret(env, TOKEN_LABEL).then(hex);
    memo.secrets.set(secret, derived);
  }
  return derived;
}
