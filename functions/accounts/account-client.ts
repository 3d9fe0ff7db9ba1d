// The edge's KeyAccount client, the request path's view of keys and limits: authenticate
// a bearer credential at the edge (no Durable Object call), admit the request in its key's
// KeyAccount (one call), settle it there when it ends, and turn refusals into OpenAI errors
// and headers.
// See docs/edge.md.

import { logWarn } from "../../contracts/log.ts";
import type { KeyAccount } from "../../durable-objects/key-account/index.ts";
import type { KeyDirectory } from "../../durable-objects/key-directory/index.ts";
import { DIRECTORY_NAME } from "../../durable-objects/key-directory/types.ts";
import {
  ACCOUNT_WRITE_DELAY_MS,
  type AdmissionRefusal,
  type AdmitInput,
  type AdmitCredential,
  type AdmitResult,
  type InvalidKeyReason,
  type KeyCheckResult,
  type SettleInput,
  type SettleResult,
} from "../../durable-objects/key-account/types.ts";
import { formatUsd } from "../../contracts/pricing.ts";
import { sleep } from "../../contracts/sleep.ts";
import { type BrowserScope, type BrowserTokenMemo, verifyBrowserToken } from "./browser-token.ts";
import { ApiError, invalidApiKey, missingApiKey } from "../../contracts/errors.ts";
import { API_KEY_PREFIX, type ApiKeyMemo, bearerToken, parseApiKey } from "./keys.ts";
import { formatResetDuration, rateLimitHeaders, retryAfterHeaders } from "./rate-limit-headers.ts";
import { SettleQueue } from "./settle-queue.ts";
import type { AccountLeases } from "./leases.ts";
import type { LeaseAsk, LeaseHeld } from "../../durable-objects/key-account/leases/types.ts";
import type { LeaseScope } from "../../contracts/lease-scopes.ts";

/** Settlements of an isolate until their key's account holds them durably. */
export type AccountSettleQueue = SettleQueue<SettleInput>;

/** A new, empty queue of settlements for the isolate (see `settle-queue.ts`). */
export function accountSettleQueue(): AccountSettleQueue {
  return new SettleQueue<SettleInput>({ writeDelayMs: ACCOUNT_WRITE_DELAY_MS });
}

/** A credential the edge accepted: an API key (checked against its hash later) or a browser token. */
export type Credential =
  | { kind: "key"; keyId: string; secretHash: string }
  | { kind: "browser"; keyId: string; scope: BrowserScope };

/** A credential the edge accepted, or the error to answer with. */
export type Authentication = ({ ok: true } & Credential) | { ok: false; error: ApiError };

/**
 * What the request path knows about a request when it asks for admission: the account's
 * input without the credential and the carried settlements, which `admitRequest` adds.
 */
export type AdmitRequestInput = Omit<AdmitInput, "credential" | "settle">;

/**
 * Authenticates an `Authorization` header without any storage call: an API key by its
 * format and check part, a browser token by its signature, audience and times (and,
 * when the request has an Origin, by the token's origins).
 */
export async function authenticateBearer(
  env: Env,
  authorization: string | null | undefined,
  options: {
    now: number;
    origin?: string | null;
    apiKeys: ApiKeyMemo;
    browserTokens: BrowserTokenMemo;
  },
): Promise<Authentication> {
  const credential = bearerToken(authorization);
  if (credential === null) return { ok: false, error: missingApiKey() };
  if (credential.startsWith(API_KEY_PREFIX)) {
    const parsed = await parseApiKey(env, credential, options.apiKeys);
    if (parsed === null) return { ok: false, error: invalidApiKey() };
    return { ok: true, kind: "key", keyId: parsed.keyId, secretHash: parsed.secretHash };
  }
  // Neither an API key nor a browser token (a JWT: three dot-separated parts): a wrong key.
  if (credential.split(".").length !== 3) {
    return { ok: false, error: invalidApiKey() };
  }
  const scope = await verifyBrowserToken(env, credential, options.now, options.browserTokens);
  if (scope === null) {
    return { ok: false, error: invalidApiKey("Invalid or expired browser token.") };
  }
  const origin = options.origin ?? null;
  if (origin !== null && !scope.origins.includes(origin)) {
    return { ok: false, error: originNotAllowed() };
  }
  return { ok: true, kind: "browser", keyId: scope.keyId, scope };
}

/** The credential as the KeyAccount compares it. */
export function admitCredential(credential: Credential): AdmitCredential {
  return credential.kind === "key"
    ? { kind: "key", secretHash: credential.secretHash }
    : {
        kind: "browser",
        secretGeneration: credential.scope.secretGeneration,
        subject: credential.scope.subject,
        limits: credential.scope.limits,
        models: credential.scope.models,
        budgets: credential.scope.budgets,
      };
}

/** The KeyAccount of a key id. */
export function keyAccount(env: Env, keyId: string): DurableObjectStub<KeyAccount> {
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(keyId));
  const delayMs = Number(env.WARMGATE_ACCOUNT_DELAY_MS ?? 0);
  return delayMs > 0 ? delayed(stub, delayMs) : stub;
}

// Benchmarks only (`WARMGATE_ACCOUNT_DELAY_MS`): every call waits first, as if the account
// lived far away.
function delayed<T extends object>(stub: T, delayMs: number): T {
  return new Proxy(stub, {
    get(target, name) {
      const value: unknown = Reflect.get(target, name);
      // Not `then`: the stub itself is not a promise.
      if (typeof value !== "function" || name === "then") return value;
      return async (...args: unknown[]) => {
        await sleep(delayMs);
        // An RPC stub's methods are stubs too: `value.apply` would be a remote call.
        return Reflect.apply(value, target, args);
      };
    },
  });
}

/** The one KeyDirectory, which lists every key. */
export function keyDirectory(env: Env): DurableObjectStub<KeyDirectory> {
  return env.KEY_DIRECTORY.get(env.KEY_DIRECTORY.idFromName(DIRECTORY_NAME));
}

/**
 * Admits a request in its key's KeyAccount: one RPC, atomic, reserving a slot and tokens.
 * The call carries the key's settlements queued in this isolate, and its answer tells
 * which of those carried before are durable.
 */
export async function admitRequest(
  env: Env,
  settleQueue: AccountSettleQueue,
  credential: Credential,
  input: AdmitRequestInput,
  lease: LeaseAsk | null = null,
): Promise<AdmitResult & LeaseHeld> {
  const carried = settleQueue.take(credential.keyId);
  const answer = await keyAccount(env, credential.keyId).admit({
    ...(lease === null ? {} : { lease }),
    ...(carried.inputs.length === 0 ? {} : { settle: carried.inputs }),
    requestId: input.requestId,
    credential: admitCredential(credential),
    model: input.model,
    promptTokens: input.promptTokens,
    maxTokens: input.maxTokens,
    ...(input.price === undefined ? {} : { price: input.price }),
    ...(input.fallbacks === undefined ? {} : { fallbacks: input.fallbacks }),
    endUser: input.endUser ?? null,
    ...(input.tags === undefined ? {} : { tags: input.tags }),
    origin: input.origin ?? null,
    ...(input.leaseMs === undefined ? {} : { leaseMs: input.leaseMs }),
    ...(input.now === undefined ? {} : { now: input.now }),
  });
  const { commit, ...result } = answer;
  carried.answered(commit);
  return result;
}

/**
 * Checks a credential against its KeyAccount without admitting anything (no limit is
 * consumed): the key's secret, status and expiry, and the browser origin; answers the
 * models the caller may use (the key's, its team's and the browser token's).
 */
export async function checkCredential(
  env: Env,
  credential: Credential,
  options: { origin?: string | null; now?: number } = {},
): Promise<KeyCheckResult> {
  return keyAccount(env, credential.keyId).check({
    credential:
      credential.kind === "key"
        ? { kind: "key", secretHash: credential.secretHash }
        : { kind: "browser", secretGeneration: credential.scope.secretGeneration },
    origin: options.origin ?? null,
    models: credential.kind === "browser" ? credential.scope.models : null,
    ...(options.now === undefined ? {} : { now: options.now }),
  });
}

/** Extends a live request's lease in its key's account; a failed call is tried at the next turn. */
export async function renewLease(
  env: Env,
  keyId: string,
  requestId: string,
  leaseMs: number,
): Promise<void> {
  try {
    await keyAccount(env, keyId).renew({ requestIds: [requestId], leaseMs });
  } catch (error) {
    logWarn("lease renewal failed", { request_id: requestId, error });
  }
}

/**
 * Renews, tops up or releases the key's lease in the isolate (a background call; one at a
 * time per key), carrying the key's queued settlements. A failed call leaves the lease to
 * run out: requests that do not fit it are admitted exactly meanwhile.
 */
export async function callLease(
  env: Env,
  edge: { settlements: AccountSettleQueue; leases: AccountLeases },
  lease: { keyId: string; holder: string; scope: LeaseScope | null },
  mode: LeaseAsk["mode"],
  options: { windowMs: number; models: LeaseAsk["models"] },
): Promise<void> {
  const { keyId, holder: secretHash, scope } = lease;
  const now = Date.now();
  const ask = edge.leases.ask(keyId, scope, mode, { ...options, now });
  if (ask === null) return;
  const carried = edge.settlements.take(keyId);
  try {
    const answer = await keyAccount(env, keyId).lease({
      ...ask,
      secretHash,
      ...(carried.inputs.length === 0 ? {} : { settle: carried.inputs }),
    });
    carried.answered(answer.commit);
    edge.leases.answered(
      keyId,
      secretHash,
      ask,
      { lease: answer.lease, dropped: answer.lease === null },
      now,
    );
  } catch (error) {
    edge.leases.answered(keyId, secretHash, ask, null, now);
    logWarn("lease call failed", { key_id: keyId, mode, error });
  }
}

/** Settles an admitted request once (repeats are no-ops): frees its slot, corrects its tokens. */
export async function settleRequest(
  env: Env,
  keyId: string,
  input: SettleInput,
): Promise<SettleResult> {
  return keyAccount(env, keyId).settle(input);
}

/**
 * Queues an admitted request's settlement: the key's next admit or lease call from this
 * isolate carries it, or it is sent on its own after `flushMs` (by default shortly after).
 * Resolves once it is durable.
 */
export function queueSettlement(
  env: Env,
  settleQueue: AccountSettleQueue,
  keyId: string,
  input: SettleInput,
  flushMs?: number,
): Promise<void> {
  const send = async (id: string, inputs: SettleInput[]) => {
    const { commit } = await keyAccount(env, id).settleMany(inputs);
    return commit;
  };
  return settleQueue.settle(keyId, input, send, flushMs);
}

/** The OpenAI error for an admission refusal, with `retry-after` and rate-limit headers on 429. */
export function refusalError(
  refusal: AdmissionRefusal,
  keyId: string,
  credential: Credential["kind"] = "key",
): ApiError {
  switch (refusal.code) {
    case "invalid_api_key":
      return invalidApiKey(INVALID_KEY_MESSAGES[refusal.reason]);
    case "origin_not_allowed":
      return originNotAllowed();
    case "key_blocked":
      return new ApiError(
        403,
        `API key ${keyId} is blocked: its operator has stopped its requests until it is unblocked.`,
        { type: "permission_error", code: "key_blocked" },
      );
    case "model_not_allowed":
      const holder = credential === "browser" ? "browser token" : "key";
      return new ApiError(403, `This ${holder} may not use the model \`${refusal.model}\`.`, {
        type: "invalid_request_error",
        code: "model_not_allowed",
        param: "model",
      });
    case "rate_limit_exceeded": {
      const unit =
        refusal.limit === "tokens"
          ? "tokens per min (TPM)"
          : refusal.limit === "requests"
            ? "requests per min (RPM)"
            : "concurrent requests";
      const who =
        refusal.scope === "key"
          ? `key ${keyId}`
          : refusal.scope === "team"
            ? `team ${refusal.teamId ?? ""} of key ${keyId}`
            : refusal.scope === "model"
              ? `model ${refusal.model ?? ""} of key ${keyId}`
              : `this end user of key ${keyId}`;
      const message = refusal.tooLarge
        ? `Request too large for ${who} on ${unit}: Limit ${refusal.limitValue}, Requested ${refusal.requested}. Reduce the prompt or max_tokens.`
        : `Rate limit reached for ${who} on ${unit}: Limit ${refusal.limitValue}, Requested ${refusal.requested}. Please try again in ${formatResetDuration(refusal.retryAfterMs)}.`;
      // OpenAI names the exhausted limit in `type`: `tokens` or `requests`.
      return new ApiError(429, message, {
        type: refusal.limit === "tokens" ? "tokens" : "requests",
        code: "rate_limit_exceeded",
        // A request larger than the limit itself never fits: no wait helps, no SDK retries.
        headers: {
          ...rateLimitHeaders(refusal.rateLimit),
          ...(refusal.tooLarge
            ? { "x-should-retry": "false" }
            : retryAfterHeaders(refusal.retryAfterMs)),
        },
      });
    }
    case "insufficient_quota": {
      const owner =
        refusal.scope === "key"
          ? `key ${keyId}`
          : refusal.scope === "team"
            ? `team ${refusal.teamId ?? ""} of key ${keyId}`
            : `this end user of key ${keyId}`;
      const budget =
        refusal.budget === "credit"
          ? "credit"
          : refusal.budget === "month"
            ? "monthly budget (UTC calendar month)"
            : `${refusal.budget} budget (UTC)`;
      const soon = refusal.retryAfterMs !== null && refusal.retryAfterMs <= SDK_RETRY_LIMIT_MS;
      const when =
        refusal.retryAfterMs === null
          ? refusal.budget === "credit"
            ? "Ask for more credit to continue."
            : "This request may cost more than the whole budget: lower its max_tokens, or raise the budget."
          : soon
            ? `${refusal.scope === "team" ? "Its keys' requests" : "Requests"} in flight hold part of it; please try again in ${formatResetDuration(refusal.retryAfterMs)}.`
            : `It renews in ${formatResetDuration(refusal.retryAfterMs)}${renewsAt(refusal.resetsAt)}.`;
      return new ApiError(
        429,
        `You exceeded the ${budget} of ${owner}: limit $${formatUsd(refusal.limitPicos)}, spent $${formatUsd(refusal.spentPicos)}, ${refusal.scope === "team" ? "held by its keys" : "reserved by requests in flight"} $${formatUsd(refusal.reservedPicos)}, this request may cost up to $${formatUsd(refusal.requestedPicos)}. ${when}`,
        {
          type: "insufficient_quota",
          code: "insufficient_quota",
          headers: {
            ...rateLimitHeaders(refusal.rateLimit),
            ...(refusal.retryAfterMs === null ? {} : retryAfterHeaders(refusal.retryAfterMs)),
            // The official SDKs retry every 429 unless told not to; only a soon retry helps.
            ...(soon ? {} : { "x-should-retry": "false" }),
          },
        },
      );
    }
    default: {
      const unhandled: never = refusal;
      throw new Error(`unhandled refusal ${JSON.stringify(unhandled)}`);
    }
  }
}

// Longest `retry-after` the official SDKs honour; a longer wait is not worth their retry.
const SDK_RETRY_LIMIT_MS = 60_000;

const INVALID_KEY_MESSAGES: Record<InvalidKeyReason, string> = {
  unknown: "Incorrect API key provided.",
  bad_secret: "Incorrect API key provided.",
  revoked: "This API key has been revoked.",
  expired: "This API key has expired.",
  rotated: "This browser token was minted with a key that has since been rotated; mint a new one.",
};

function originNotAllowed(): ApiError {
  return new ApiError(403, "Requests from this origin are not allowed for this key.", {
    type: "invalid_request_error",
    code: "origin_not_allowed",
  });
}

// When a budget's window ends, as the refusal's message says it.
function renewsAt(resetsAt: number | null): string {
  return resetsAt === null ? "" : ` (at ${new Date(resetsAt).toISOString()})`;
}
