/**
 * The end user's part of an end user's lease (docs/key-account.md, "Leased allowances"): a
 * browser token's user lends from its own buckets and slots as well as the key's, and gets
 * back what its lease left unused; the lease's models are the key's and the token's, and
 * its headers show whichever scope has less left. A lease without a token's user is the
 * key's alone.
 */
import {
  type LeaseScope,
  budgetsBarLease,
  leaseScopeKey,
} from "../../../contracts/lease-scopes.ts";
import { rateLimitNow } from "../admission.ts";
import { type AccountStore, userScope } from "../store.ts";
import { refill } from "../token-bucket.ts";
import type { AdmitInput, RateLimitInfo } from "../types.ts";
import type { Allowance } from "./sizing.ts";
import type { LeaseAsk } from "./types.ts";

/** What the key has left, within what the lease's end user has left. */
export function scopeHeadroom(
  store: AccountStore,
  scope: LeaseScope | null,
  key: Allowance,
  now: number,
): Allowance {
  const subject = scope?.subject ?? null;
  if (subject === null) return key;
  const { limits } = subject;
  const usage = store.scopeUsage(userScope(subject.id), subject.id);
  const level = (bucket: typeof usage.requests, capacity: number) =>
    bucket === null ? capacity : refill(bucket, capacity, now).level;
  return {
    requests: Math.min(key.requests, level(usage.requests, limits.rpm)),
    tokens: Math.min(key.tokens, level(usage.tokens, limits.tpm)),
    picos: key.picos,
    slots: Math.min(key.slots, limits.concurrency - usage.inFlight),
  };
}

/**
 * Moves requests and tokens between the lease and its end user's buckets: taken when
 * granted (negative), given back when unused (positive).
 */
export function moveScopeUnits(
  store: AccountStore,
  scope: LeaseScope | null,
  units: { requests: number; tokens: number },
  now: number,
): void {
  const subject = scope?.subject ?? null;
  if (subject === null) return;
  const name = userScope(subject.id);
  store.buckets.adjust(name, "requests", subject.limits.rpm, units.requests, now);
  store.buckets.adjust(name, "tokens", subject.limits.tpm, units.tokens, now);
}

/** The lease's headers: per dimension, whichever of the key and its end user has less left. */
export function scopeRateLimit(
  store: AccountStore,
  scope: LeaseScope | null,
  key: RateLimitInfo,
  now: number,
): RateLimitInfo {
  const subject = scope?.subject ?? null;
  if (subject === null) return key;
  const user = rateLimitNow(
    subject.limits,
    store.scopeUsage(userScope(subject.id), subject.id),
    now,
  );
  return {
    requests: user.requests.remaining < key.requests.remaining ? user.requests : key.requests,
    tokens: user.tokens.remaining < key.tokens.remaining ? user.tokens : key.tokens,
  };
}

/**
 * The lease an admission asks about, when it is of the admitted request's own scope (its
 * browser token's user, its end user); undefined otherwise, and then no lease is touched.
 * None for a token that carries budgets: a lease holds the key's money, not the user's.
 */
export function ownLeaseAsk(input: AdmitInput & { lease?: LeaseAsk }): LeaseAsk | undefined {
  const ask = input.lease;
  if (ask === undefined) return undefined;
  const scope = ask.scope ?? null;
  const endUser = input.endUser ?? null;
  const { credential } = input;
  if (credential.kind === "key") {
    const fits =
      scope === null ? endUser === null : scope.subject === null && scope.endUser === endUser;
    return fits ? ask : undefined;
  }
  if (budgetsBarLease(credential.budgets)) return undefined;
  const own: LeaseScope = {
    endUser,
    subject: { id: credential.subject, limits: credential.limits, models: credential.models },
  };
  return leaseScopeKey(scope) === leaseScopeKey(own) ? ask : undefined;
}
