/**
 * The leases an isolate holds from its keys' accounts (docs/edge.md, "Leased allowances";
 * docs/key-account.md): a request that fits its key's lease is admitted here, with no call,
 * under an id the lease names; the lease is renewed in the background before it runs out,
 * and trimmed before any exact admission. A key's end users each have a lease of their own
 * (their requests name them; a browser token's user is bound by its own limits too).
 */
import { leasedRequestId } from "../../contracts/lease-ids.ts";
import { type LeaseScope, leaseScopeKey } from "../../contracts/lease-scopes.ts";
import { type ModelPrice, maxPicos, worstCasePicos } from "../../contracts/pricing.ts";
import { hourOf } from "../../contracts/budget-periods.ts";
import type {
  LeaseAsk,
  LeaseGrant,
  LeaseRate,
  LeaseUse,
} from "../../durable-objects/key-account/leases/types.ts";
import type { AdmitOk, RateLimitInfo } from "../../durable-objects/key-account/types.ts";

/** A model a request may be served by, with its completion allowance and price. */
export interface LeaseCandidate {
  model: string;
  maxTokens: number;
  price: ModelPrice;
}

/** What a request asks of its key's lease. */
export interface LocalRequest {
  candidates: readonly LeaseCandidate[];
  promptTokens: number;
  origin: string | null;
}

/** A request admitted under a lease: the admission, and what its settlement reports. */
export interface LeasedAdmission {
  admission: AdmitOk;
  leaseId: string;
  /** Whose lease admitted it: the key's (null), or one end user's. */
  scope: LeaseScope | null;
  admittedAt: number;
}

// One key's lease as the isolate holds it; `used` counts from its grant, like `granted`.
interface Held {
  secretHash: string;
  grant: LeaseGrant;
  used: LeaseUse;
  /** The isolate's clock: it admits under the lease until then. */
  admitUntil: number;
  renewedAt: number;
  /** A trim is under way: nothing is admitted under it until its answer. */
  frozen: boolean;
}

// One lease's state in the isolate (the key's, or one end user's): the lease, whether a call
// about it is under way, its rate.
interface KeyLeases {
  scope: LeaseScope | null;
  held: Held | null;
  busy: boolean;
  window: { start: number; rate: LeaseRate };
  previous: LeaseRate;
}

type HeldRef = { holder: string; scope: LeaseScope | null };

const NO_RATE: LeaseRate = { requests: 0, tokens: 0, picos: 0n, inFlight: 0 };

/** End users of one key that may hold leases in an isolate at once; others are admitted exactly. */
export const MAX_END_USER_LEASES = 16;
// Scopes of one key whose rate the isolate counts; idle ones beyond it are forgotten.
const MAX_COUNTED_SCOPES = 64;

/** Every lease of one isolate, by key id and scope. */
export class AccountLeases {
  readonly #keys = new Map<string, Map<string, KeyLeases>>();
  #leasedKeys = { count: 0, at: Number.NEGATIVE_INFINITY };

  /**
   * Admits a request under its key's lease when it fits every allowance and the key's terms
   * as the lease carries them; null otherwise (the request is then admitted exactly).
   */
  admit(
    keyId: string,
    secretHash: string,
    scope: LeaseScope | null,
    request: LocalRequest,
    now: number,
  ): LeasedAdmission | null {
    const key = this.#keys.get(keyId)?.get(leaseScopeKey(scope));
    const held = key?.held;
    if (key === undefined || held === undefined || held === null) return null;
    const { grant, used } = held;
    if (held.frozen || held.secretHash !== secretHash || now >= held.admitUntil) return null;
    if (hourOf(now) !== grant.hour) return null;
    const terms = grant.key;
    if (terms.expiresAt !== null && now >= terms.expiresAt) return null;
    if (request.origin !== null && !terms.allowedOrigins.includes(request.origin)) return null;
    const allowed = request.candidates.filter(
      (candidate) => terms.models === null || terms.models.includes(candidate.model),
    );
    const first = allowed[0];
    if (first === undefined) return null;
    if (allowed.some((candidate) => terms.limitedModels.includes(candidate.model))) return null;
    // Priced as the lease's table prices it: a model whose price changed since is not leased.
    const index = grant.models.findIndex(
      (entry) => entry.model === first.model && samePrice(entry.price, first.price),
    );
    if (index < 0) return null;
    const { tokens, picos } = reservationOf(request.promptTokens, allowed);
    const fits =
      used.requests + 1 <= grant.granted.requests &&
      used.tokens + tokens <= grant.granted.tokens &&
      (grant.granted.picos === null || used.picos + picos <= grant.granted.picos) &&
      used.inFlight < grant.slots &&
      used.ids < grant.granted.ids;
    if (!fits) return null;
    const requestId = leasedRequestId(grant.leaseId, index, used.ids);
    held.used = {
      requests: used.requests + 1,
      tokens: used.tokens + tokens,
      picos: grant.granted.picos === null ? 0n : used.picos + picos,
      ids: used.ids + 1,
      inFlight: used.inFlight + 1,
    };
    this.#count(key, now, tokens, picos);
    return {
      leaseId: grant.leaseId,
      scope,
      admittedAt: now,
      admission: {
        ok: true,
        models: allowed.map((c) => c.model),
        reservedTokens: tokens,
        reservedPicos: picos,
        rateLimit: localRateLimit(grant, held.used),
        requestId,
        tier: terms.tier,
        allowRegionOverride: terms.allowRegionOverride,
        teamId: terms.teamId,
        leaseExpiresAt: held.admitUntil,
        budgeted: terms.budgeted,
      },
    };
  }

  /** A leased request ended (settled, or released when its client left): its slot is free. */
  ended(keyId: string, scope: LeaseScope | null, leaseId: string): void {
    const held = this.#keys.get(keyId)?.get(leaseScopeKey(scope))?.held;
    if (held?.grant.leaseId !== leaseId) return;
    held.used = { ...held.used, inFlight: Math.max(0, held.used.inFlight - 1) };
  }

  /**
   * What a call about the key's lease asks, or null when one is under way (one at a time,
   * so answers never cross), or when the key's end users hold as many leases as they may.
   * `trim` freezes the lease until {@link answered}.
   */
  ask(
    keyId: string,
    scope: LeaseScope | null,
    mode: LeaseAsk["mode"],
    options: { windowMs: number; models: LeaseAsk["models"]; now: number },
  ): LeaseAsk | null {
    const key = this.#key(keyId, scope, options.now);
    if (key.busy) return null;
    if (scope !== null && key.held === null && this.#userLeases(keyId) >= MAX_END_USER_LEASES) {
      return null;
    }
    key.busy = true;
    const held = key.held;
    if (held !== null && mode !== "renew") held.frozen = true;
    return {
      held: held === null ? null : { leaseId: held.grant.leaseId, used: { ...held.used } },
      mode,
      rate: this.#rate(key, options.now),
      windowMs: options.windowMs,
      models: options.models,
      ...(scope !== null && { scope }),
    };
  }

  /**
   * The answer to a call that asked `ask` (null: the call failed, or the account granted
   * none): holds the lease it grants, or keeps what remains of the one held, trimmed.
   */
  answered(
    keyId: string,
    secretHash: string,
    ask: LeaseAsk,
    answer: { lease: LeaseGrant | null; dropped: boolean } | null,
    sentAt: number,
  ): void {
    const key = this.#keys.get(keyId)?.get(leaseScopeKey(ask.scope));
    if (key === undefined) return;
    key.busy = false;
    const held = key.held;
    if (held !== null) held.frozen = false;
    if (answer === null) return;
    const lease = answer.lease;
    if (answer.dropped || ask.mode === "release") {
      key.held = null;
    } else if (lease !== null) {
      const same = held !== null && held.grant.leaseId === lease.leaseId;
      key.held = {
        secretHash,
        grant: lease,
        used: same ? held.used : { requests: 0, tokens: 0, picos: 0n, ids: 0, inFlight: 0 },
        admitUntil: sentAt + lease.admitForMs,
        renewedAt: sentAt,
        frozen: false,
      };
    } else if (held !== null && ask.mode === "trim" && ask.held !== null) {
      // Trimmed to what was used when it was asked; nothing was admitted since.
      const { used } = ask.held;
      const picos = held.grant.granted.picos === null ? null : used.picos;
      held.grant = {
        ...held.grant,
        granted: { requests: used.requests, tokens: used.tokens, picos, ids: used.ids },
        slots: used.inFlight,
      };
    }
  }

  /**
   * Whether the key's lease should be renewed now: less than half its window left, or less
   * than one window of the isolate's use left in any allowance.
   */
  due(keyId: string, scope: LeaseScope | null, windowMs: number, now: number): boolean {
    const key = this.#keys.get(keyId)?.get(leaseScopeKey(scope));
    const held = key?.held;
    if (key === undefined || held === undefined || held === null || key.busy) return false;
    if (held.admitUntil - now < windowMs / 2) return true;
    const rate = this.#rate(key, now);
    const { granted } = held.grant;
    return (
      granted.requests - held.used.requests < Math.max(1, rate.requests) ||
      granted.tokens - held.used.tokens < rate.tokens ||
      (granted.picos !== null && granted.picos - held.used.picos < rate.picos) ||
      held.grant.slots - held.used.inFlight < 1
    );
  }

  /** Keys with a lease that admits now (counted at most once per {@link LEASED_KEYS_MS}). */
  leasedKeys(now: number): number {
    if (now - this.#leasedKeys.at < LEASED_KEYS_MS) return this.#leasedKeys.count;
    let count = 0;
    for (const scopes of this.#keys.values()) {
      for (const entry of scopes.values()) {
        if (entry.held !== null && now < entry.held.admitUntil) {
          count++;
          break;
        }
      }
    }
    this.#leasedKeys = { count, at: now };
    return count;
  }

  /** The key's leases here but `scope`'s (all if `withOwn`): what may stand in the way. */
  others(keyId: string, scope: LeaseScope | null, withOwn = false): HeldRef[] {
    const own = leaseScopeKey(scope);
    const found: HeldRef[] = [];
    for (const [at, entry] of this.#keys.get(keyId) ?? []) {
      if ((at === own && !withOwn) || entry.held === null) continue;
      found.push({ holder: entry.held.secretHash, scope: entry.scope });
    }
    return found;
  }

  /** Whether a call about the lease is under way. */
  busy(keyId: string, scope: LeaseScope | null): boolean {
    return this.#keys.get(keyId)?.get(leaseScopeKey(scope))?.busy ?? false;
  }

  /** Forgets the key's leases (the key changed here: it is admitted exactly from now). */
  drop(keyId: string): void {
    this.#keys.delete(keyId);
  }

  /** The lease held for a key or one of its end users (for tests and diagnostics). */
  held(
    keyId: string,
    scope: LeaseScope | null = null,
  ): { leaseId: string; used: LeaseUse; granted: LeaseGrant["granted"] } | null {
    const held = this.#keys.get(keyId)?.get(leaseScopeKey(scope))?.held;
    return held === undefined || held === null
      ? null
      : { leaseId: held.grant.leaseId, used: held.used, granted: held.grant.granted };
  }

  #key(keyId: string, scope: LeaseScope | null, now: number): KeyLeases {
    let scopes = this.#keys.get(keyId);
    if (scopes === undefined) {
      scopes = new Map();
      this.#keys.set(keyId, scopes);
    }
    const name = leaseScopeKey(scope);
    let key = scopes.get(name);
    if (key === undefined) {
      if (scopes.size >= MAX_COUNTED_SCOPES) {
        for (const [other, entry] of scopes) {
          if (entry.held === null && !entry.busy) scopes.delete(other);
        }
      }
      key = {
        scope,
        held: null,
        busy: false,
        window: { start: now, rate: NO_RATE },
        previous: NO_RATE,
      };
      scopes.set(name, key);
    }
    return key;
  }

  // End users' leases of a key the isolate holds, or has asked for and not heard back about.
  #userLeases(keyId: string): number {
    const scopes = [...(this.#keys.get(keyId)?.values() ?? [])];
    return scopes.filter((e) => e.scope !== null && (e.held !== null || e.busy)).length;
  }

  // Counts an admission (leased or exact) in the key's current window.
  #count(key: KeyLeases, now: number, tokens: number, picos: bigint): void {
    this.#roll(key, now);
    const { rate } = key.window;
    key.window.rate = {
      requests: rate.requests + 1,
      tokens: rate.tokens + tokens,
      picos: rate.picos + picos,
      inFlight: Math.max(rate.inFlight, key.held?.used.inFlight ?? 0),
    };
  }

  /** Counts a request admitted exactly in the key's rate, which sizes its next lease. */
  note(keyId: string, scope: LeaseScope | null, request: LocalRequest, now: number): void {
    const { tokens, picos } = reservationOf(request.promptTokens, request.candidates);
    this.#count(this.#key(keyId, scope, now), now, tokens, picos);
  }

  // The busier of the last full window and the current one.
  #rate(key: KeyLeases, now: number): LeaseRate {
    this.#roll(key, now);
    const current = key.window.rate;
    return current.requests >= key.previous.requests ? current : key.previous;
  }

  #roll(key: KeyLeases, now: number): void {
    // A window is a second: leases are sized from what a second asks, twice over.
    if (now - key.window.start < RATE_WINDOW_MS) return;
    key.previous = now - key.window.start < 2 * RATE_WINDOW_MS ? key.window.rate : NO_RATE;
    key.window = { start: now, rate: NO_RATE };
  }
}

/** How long the isolate counts its use of a key to size its next lease. */
export const RATE_WINDOW_MS = 1_000;

// How long a count of leased keys stands.
const LEASED_KEYS_MS = 100;

// What a request reserves, as its account reckons it (admission.ts): its prompt and the
// largest allowance of its models, and the largest worst-case cost.
function reservationOf(
  promptTokens: number,
  candidates: readonly LeaseCandidate[],
): { tokens: number; picos: bigint } {
  return {
    tokens: promptTokens + Math.max(0, ...candidates.map((c) => c.maxTokens)),
    picos: candidates.reduce(
      (most, c) => maxPicos(most, worstCasePicos(c.price, promptTokens, c.maxTokens)),
      0n,
    ),
  };
}

function samePrice(a: ModelPrice, b: ModelPrice): boolean {
  return (
    a.inputMicrosPerMtok === b.inputMicrosPerMtok &&
    a.cachedInputMicrosPerMtok === b.cachedInputMicrosPerMtok &&
    a.outputMicrosPerMtok === b.outputMicrosPerMtok
  );
}

// The key's headers as this isolate sees them: what its account had left at the lease's
// last renewal, plus what the lease still holds.
function localRateLimit(grant: LeaseGrant, used: LeaseUse): RateLimitInfo {
  const { requests, tokens } = grant.rateLimit;
  return {
    requests: {
      ...requests,
      remaining: Math.max(0, requests.remaining + grant.granted.requests - used.requests),
    },
    tokens: {
      ...tokens,
      remaining: Math.max(0, Math.floor(tokens.remaining + grant.granted.tokens - used.tokens)),
    },
  };
}
