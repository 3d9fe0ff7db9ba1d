/**
 * The contract of leased allowances between the edge and a key's `KeyAccount`
 * (docs/key-account.md, "Leased allowances"): what an isolate asks for, reports and is
 * granted. The edge imports this file and the key account's `types.ts`, nothing else.
 */
import type { CommitStamp } from "../../../contracts/commit-stamp.ts";
import type { ModelPrice } from "../../../contracts/pricing.ts";
import type { LeaseScope } from "../../../contracts/lease-scopes.ts";
import type { CredentialRefusal, KeyTier, RateLimitInfo, SettleInput } from "../types.ts";

/** What an isolate took from a lease so far, counted from its grant (cumulative). */
export interface LeaseUse {
  requests: number;
  tokens: number;
  /** Worst-case costs reserved by its requests (pico-dollars). */
  picos: bigint;
  /** Request ids named (`contracts/lease-ids.ts`); one per request. */
  ids: number;
  /** Its requests now in flight. */
  inFlight: number;
}

/** How much an isolate used over its last window: what its next lease is sized from. */
export interface LeaseRate {
  requests: number;
  tokens: number;
  picos: bigint;
  /** The most requests it had in flight at once. */
  inFlight: number;
}

/** What an isolate asks of its key's account about a lease. */
export interface LeaseAsk {
  /** The lease held, if any, with what was taken from it. */
  held: { leaseId: string; used: LeaseUse } | null;
  /**
   * `renew`: extend it and top it up; `trim`: give back what is unused first (the isolate
   * admits nothing under it until the answer); `release`: give back what is unused and end
   * it (no request of it is in flight).
   */
  mode: "renew" | "trim" | "release";
  rate: LeaseRate;
  /** How long the isolate may admit under it without renewing (config `leases.window_ms`). */
  windowMs: number;
  /** The models it may serve under a new lease, with their prices (its price table). */
  models: { model: string; price: ModelPrice }[];
  /** One end user's lease (each end user of a key has its own); absent: the key's. */
  scope?: LeaseScope | null;
}

/** What an isolate may admit under a lease (cumulative from its grant), and the key's terms. */
export interface LeaseGrant {
  leaseId: string;
  /** Cumulative grants: what the isolate may have taken in all since the lease began. */
  granted: { requests: number; tokens: number; picos: bigint | null; ids: number };
  /** Requests it may have in flight at once. */
  slots: number;
  /** How long from the account's answer the isolate may admit under it. */
  admitForMs: number;
  /** The UTC hour (since the epoch) its money counts in: it admits nothing in another hour. */
  hour: number;
  /** The price table: request ids name the model they were admitted for by its index. */
  models: { model: string; price: ModelPrice }[];
  key: {
    models: string[] | null;
    allowedOrigins: string[];
    /** Epoch ms after which the key is refused, or null. */
    expiresAt: number | null;
    tier: KeyTier;
    allowRegionOverride: boolean;
    budgeted: boolean;
    /** The key's team, or null. */
    teamId: string | null;
    /** Models with their own limits (`model_limits`): their requests are admitted exactly. */
    limitedModels: string[];
  };
  /** The key's buckets as the grant left them, without what this lease holds. */
  rateLimit: RateLimitInfo;
}

/** The lease an admission's answer carries when it was asked for one (null: none). */
export interface LeaseHeld {
  lease?: LeaseGrant | null;
}

/** The answer to a lease call: the lease to hold now (null: none), and where its writes stand. */
export interface LeaseAnswer {
  lease: LeaseGrant | null;
  /** Why the key refuses every request now (revoked, rotated, expired); the lease ended. */
  refusal: CredentialRefusal | null;
  commit: CommitStamp;
}

/**
 * A lease call: the ask, who holds the lease (an API key's hash, or `gen:<n>` for a browser
 * token minted with the key's secret of generation n), and settlements it carries.
 */
export interface LeaseCall extends LeaseAsk {
  secretHash: string;
  settle?: SettleInput[];
  now?: number;
}
