/**
 * Whose requests a lease admits and who holds it (docs/key-account.md, "Leased allowances"):
 * a key's own lease, or one of its end users' (the body's `user`, or a browser token's user
 * with the token's own limits), held by an API key's secret or a browser token's generation.
 * The edge and the key's account name leases the same way with these.
 */

/** One end user's lease of a key; null is the key's own. */
export interface LeaseScope {
  /** The end user its requests are recorded for (the body's `user`, or a token's user). */
  endUser: string | null;
  /** A browser token's end user, with the token's limits and models (its buckets `u:<id>`). */
  subject: {
    id: string;
    limits: { rpm: number; tpm: number; concurrency: number };
    models: string[] | null;
  } | null;
}

/** How a credential presents itself to a lease: an API key's hash, or a token's generation. */
export type LeaseCredential =
  | { kind: "key"; secretHash: string }
  | { kind: "browser"; secretGeneration: number };

const BROWSER_HOLDER = "gen:";

/** Who holds a lease: an API key's secret hash, or `gen:<n>` for a browser token's secret. */
export function leaseHolder(credential: LeaseCredential): string {
  return credential.kind === "key"
    ? credential.secretHash
    : `${BROWSER_HOLDER}${credential.secretGeneration}`;
}

/** The credential a lease's holder stands for (see {@link leaseHolder}). */
export function holderCredential(holder: string): LeaseCredential {
  if (!holder.startsWith(BROWSER_HOLDER)) return { kind: "key", secretHash: holder };
  return { kind: "browser", secretGeneration: Number(holder.slice(BROWSER_HOLDER.length)) };
}

/** One string per scope, equal exactly when two scopes are the same ("" for the key's). */
export function leaseScopeKey(scope: LeaseScope | null | undefined): string {
  if (scope === null || scope === undefined) return "";
  const { subject } = scope;
  return JSON.stringify([
    scope.endUser,
    subject?.id ?? null,
    subject === null ? null : [subject.limits.rpm, subject.limits.tpm, subject.limits.concurrency],
    subject?.models ?? null,
  ]);
}

/**
 * Whether a browser token's end-user budgets keep its requests out of every lease: a lease
 * holds the key's money, not the user's, so such a token is admitted exactly.
 */
export function budgetsBarLease(budgets: readonly unknown[] | undefined): boolean {
  return (budgets?.length ?? 0) > 0;
}
