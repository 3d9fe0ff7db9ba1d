/**
 * Granting, renewing, trimming and ending the leases isolates hold (docs/key-account.md,
 * "Leased allowances"): requests and tokens taken from the key's buckets, money reserved
 * in its budgets, concurrency slots counted in flight, each given back when unused. Runs
 * in the account's synchronous turn, like admission.
 */
import { MAX_LEASE_MODELS, newLeaseId } from "../../../contracts/lease-ids.ts";
import { holderCredential, leaseScopeKey } from "../../../contracts/lease-scopes.ts";
import type { ModelPrice } from "../../../contracts/pricing.ts";
import { HOUR_MS, hourOf } from "../../../contracts/budget-periods.ts";
import { keyRefusal, modelAllowed, rateLimitNow } from "../admission.ts";
import { budgetRoom, hasBudgets } from "../budgets.ts";
import { checkCredential } from "../credential.ts";
import { KEY_SCOPE, storedCandidate } from "../schema.ts";
import type { AccountStore } from "../store.ts";
import type { LeaseEntry } from "../store/leases.ts";
import { refill, take } from "../token-bucket.ts";
import type { CredentialRefusal } from "../types.ts";
import { moveScopeUnits, scopeHeadroom, scopeRateLimit } from "./scope.ts";
import { usableModels } from "../team/pool.ts";
import { type Allowance, leaseTarget, topUp } from "./sizing.ts";
import { withinTeam } from "./team.ts";
import type { LeaseAsk, LeaseGrant, LeaseUse } from "./types.ts";

/** What a lease call decided: the lease to hold now (null: none), or why the key refuses. */
export interface LeaseOutcome {
  lease: LeaseGrant | null;
  refusal: CredentialRefusal | null;
}

/**
 * Gives back what the isolate left unused of the lease it holds: all of it and the lease
 * ends (`release`), or all of it while the lease goes on (`trim`, before an exact
 * admission, so that its own lease never stands in a request's way).
 */
export function giveBack(
  store: AccountStore,
  ask: LeaseAsk,
  secretHash: string,
  now: number,
): void {
  const lease = heldLease(store, ask, secretHash);
  if (lease === undefined || ask.held === null || ask.mode === "renew") return;
  const used = clampUse(lease, ask.held.used);
  const limits = store.key.record?.limits;
  // What the lease took of the key's team allowance goes back to it too.
  store.team.change((pool) => {
    pool.requests += lease.requests - used.requests;
    pool.tokens += lease.tokens - used.tokens;
  });
  if (limits !== undefined) {
    store.buckets.adjust(KEY_SCOPE, "requests", limits.rpm, lease.requests - used.requests, now);
    store.buckets.adjust(KEY_SCOPE, "tokens", limits.tpm, lease.tokens - used.tokens, now);
  }
  const unusedUnits = {
    requests: lease.requests - used.requests,
    tokens: lease.tokens - used.tokens,
  };
  moveScopeUnits(store, lease.scope, unusedUnits, now);
  if (lease.picos !== null) {
    const unused = lease.picos - used.picos;
    store.spend.add(lease.hour, { reservedPicos: -unused, settledPicos: 0n });
    lease.reservedPicos -= unused;
    lease.picos = used.picos;
  }
  lease.requests = used.requests;
  lease.tokens = used.tokens;
  lease.slots = used.inFlight;
  if (ask.mode === "release" && used.inFlight === 0) {
    // Settlements under way still find its money; it ends a window later.
    lease.state = "closing";
    lease.idsUsed = used.ids;
    lease.ids = used.ids;
    lease.expiresAt = now + ask.windowMs;
  }
  store.leases.put(lease);
}

/**
 * Answers an isolate's call about its lease: gives back what it holds unused (`trim`,
 * `release`), and tops it up on a renewal only. A trim is asked so that an exact admission
 * of the key finds the slots the lease held unused (an end user's lease idle beside it):
 * topped up again, the lease would take them back before that admission is asked again.
 */
export function answerLeaseCall(
  store: AccountStore,
  call: LeaseAsk,
  secretHash: string,
  now: number,
): LeaseOutcome {
  giveBack(store, call, secretHash, now);
  return grantLease(store, call, secretHash, now, call.mode === "renew");
}

/**
 * Renews the lease the isolate holds, or grants a new one, topped up (`grow`) to what its
 * rate asks within a share of the key's headroom; none for a key that refuses the
 * credential, or whose headroom cannot hold a few of the isolate's requests. Without
 * `grow`, the lease stays as its trim left it, and none is granted.
 */
export function grantLease(
  store: AccountStore,
  ask: LeaseAsk,
  secretHash: string,
  now: number,
  grow: boolean,
): LeaseOutcome {
  const record = store.key.record;
  if (record === null)
    return { lease: null, refusal: { ok: false, code: "invalid_api_key", reason: "unknown" } };
  const secret = checkCredential(store.key.secrets, holderCredential(secretHash), now);
  if (!secret.ok) return { lease: null, refusal: secret };
  const refused = keyRefusal(record, null, now);
  if (refused !== null) return { lease: null, refusal: refused };
  if (ask.mode === "release") return { lease: null, refusal: null };
  endDueLeases(store, now);
  // A lease's money counts in one UTC hour, so that every budget window holds it whole.
  const hour = hourOf(now);
  const held = heldLease(store, ask, secretHash);
  let lease = held !== undefined && held.hour === hour ? held : undefined;
  const used: LeaseUse =
    lease === undefined || ask.held === null ? NOTHING_USED : clampUse(lease, ask.held.used);
  const usage = store.scopeUsage(KEY_SCOPE, null);
  const { limits, budgets } = record;
  const scope = ask.scope ?? null;
  const headroom = withinTeam(
    store,
    usage.inFlight,
    scopeHeadroom(
      store,
      scope,
      {
        requests:
          usage.requests === null ? limits.rpm : refill(usage.requests, limits.rpm, now).level,
        tokens: usage.tokens === null ? limits.tpm : refill(usage.tokens, limits.tpm, now).level,
        picos: budgetRoom(store.spend.lines(budgets, now, KEY_SCOPE)),
        slots: limits.concurrency - usage.inFlight,
      },
      now,
    ),
  );
  const unused: Allowance =
    lease === undefined
      ? { requests: 0, tokens: 0, picos: headroom.picos === null ? null : 0n, slots: 0 }
      : {
          requests: lease.requests - used.requests,
          tokens: lease.tokens - used.tokens,
          picos: lease.picos === null ? null : lease.picos - used.picos,
          slots: lease.slots - used.inFlight,
        };
  const add = grow ? topUp(leaseTarget(ask.rate), unused, headroom) : null;
  if (lease === undefined) {
    if (add === null) return { lease: null, refusal: null };
    lease = newLease(store, ask, secretHash, hour, now, headroom.picos !== null);
  }
  if (add !== null) {
    const requests = take(
      usage.requests ?? { level: limits.rpm, updatedAt: now },
      limits.rpm,
      add.requests,
      now,
    );
    const tokens = take(
      usage.tokens ?? { level: limits.tpm, updatedAt: now },
      limits.tpm,
      add.tokens,
      now,
    );
    store.buckets.put(KEY_SCOPE, { requests: requests.state, tokens: tokens.state });
    moveScopeUnits(store, scope, { requests: -add.requests, tokens: -add.tokens }, now);
    store.team.change((pool) => {
      pool.requests -= add.requests;
      pool.tokens -= add.tokens;
    });
    lease.requests += add.requests;
    lease.ids += add.requests;
    lease.tokens += add.tokens;
    lease.slots += add.slots;
    if (lease.picos !== null && add.picos !== null) {
      lease.picos += add.picos;
      lease.reservedPicos += add.picos;
      store.spend.add(hour, { reservedPicos: add.picos, settledPicos: 0n });
    }
  }
  const validUntil =
    store.key.secrets.find((row) => row.generation === secret.secretGeneration)?.valid_until ??
    null;
  const admitForMs = Math.max(
    0,
    Math.min(
      ask.windowMs,
      (hour + 1) * HOUR_MS - now,
      (validUntil ?? Infinity) - now,
      (record.expiresAt ?? Infinity) - now,
    ),
  );
  lease.expiresAt = Math.max(lease.expiresAt, now + admitForMs + ask.windowMs);
  lease.idsUsed = lease.ids;
  store.leases.put(lease);
  return {
    refusal: null,
    lease: {
      leaseId: lease.leaseId,
      granted: {
        requests: lease.requests,
        tokens: lease.tokens,
        picos: lease.picos,
        ids: lease.ids,
      },
      slots: lease.slots,
      admitForMs,
      hour,
      models: lease.models.map(([model, input, cachedInput, output]) => ({
        model,
        price: {
          inputMicrosPerMtok: input,
          cachedInputMicrosPerMtok: cachedInput,
          outputMicrosPerMtok: output,
        },
      })),
      key: {
        models: usableModels(record.models, store.team.pool, scope?.subject?.models ?? null),
        allowedOrigins: record.allowedOrigins,
        expiresAt: record.expiresAt,
        tier: record.tier,
        allowRegionOverride: record.allowRegionOverride,
        budgeted: hasBudgets(budgets),
        teamId: record.teamId,
        limitedModels: Object.keys(record.modelLimits),
      },
      rateLimit: scopeRateLimit(
        store,
        scope,
        rateLimitNow(limits, store.scopeUsage(KEY_SCOPE, null), now),
        now,
      ),
    },
  };
}

/**
 * Ends the leases past their time: an open one that was not renewed (its isolate stopped,
 * or went quiet), a closing one whose settlements had a window to arrive. Their slots and
 * money come back (requests and tokens taken stay taken: their buckets refill), and every
 * request they may have admitted that was never settled is asked of the origins.
 */
export function endDueLeases(store: AccountStore, now: number): void {
  for (const lease of store.leases.all()) {
    if (lease.state === "ended" || lease.expiresAt > now) continue;
    if (lease.reservedPicos !== 0n) {
      store.spend.add(lease.hour, { reservedPicos: -lease.reservedPicos, settledPicos: 0n });
    }
    if (lease.state === "open") lease.idsUsed = lease.ids;
    lease.reservedPicos = 0n;
    lease.slots = 0;
    lease.state = "ended";
    lease.endedAt = now;
    store.leases.put(lease);
    lapseUnsettled(store, lease, now);
  }
}

/** Asks the origins again about the unsettled requests of leases ended lately (at start). */
export function restoreLapsed(store: AccountStore): void {
  for (const lease of store.leases.all()) {
    if (lease.state === "ended" && lease.endedAt !== null)
      lapseUnsettled(store, lease, lease.endedAt);
  }
}

// The ids the lease may have named without a ledger row yet are asked about as one range,
// by their prefix (reconcile.ts): none when every id it used has a row. Each request of a
// lease has one row, under the one model index its id names.
function lapseUnsettled(store: AccountStore, lease: LeaseEntry, at: number): void {
  if (lease.models.length === 0) return;
  if (store.leases.rowsOf(lease.leaseId, lease.idsUsed) >= lease.idsUsed) return;
  store.ledger.lapseLease(lease.leaseId, at);
}

const NOTHING_USED: LeaseUse = { requests: 0, tokens: 0, picos: 0n, ids: 0, inFlight: 0 };

// The open lease the call names, if it is this credential's.
function heldLease(store: AccountStore, ask: LeaseAsk, secretHash: string): LeaseEntry | undefined {
  if (ask.held === null) return undefined;
  const lease = store.leases.get(ask.held.leaseId);
  return lease?.state === "open" &&
    lease.secretHash === secretHash &&
    leaseScopeKey(lease.scope) === leaseScopeKey(ask.scope)
    ? lease
    : undefined;
}

function clamp(value: number, most: number): number {
  return Math.max(0, Math.min(most, Math.floor(value)));
}

// What the isolate says it used, never more than it was granted.
function clampUse(lease: LeaseEntry, used: LeaseUse): LeaseUse {
  const picos =
    lease.picos === null
      ? 0n
      : used.picos < 0n
        ? 0n
        : used.picos > lease.picos
          ? lease.picos
          : used.picos;
  return {
    requests: clamp(used.requests, lease.requests),
    tokens: clamp(used.tokens, lease.tokens),
    picos,
    ids: clamp(used.ids, lease.ids),
    inFlight: clamp(used.inFlight, lease.slots),
  };
}

function newLease(
  store: AccountStore,
  ask: LeaseAsk,
  secretHash: string,
  hour: number,
  now: number,
  budgeted: boolean,
): LeaseEntry {
  const scope = ask.scope ?? null;
  const allowed = usableModels(
    store.key.record?.models ?? null,
    store.team.pool,
    scope?.subject?.models ?? null,
  );
  // A model with its own limits is admitted exactly, never under a lease.
  const limited = store.key.record?.modelLimits ?? {};
  const models = ask.models
    .filter((entry: { model: string; price: ModelPrice }) => modelAllowed(allowed, entry.model))
    .filter((entry) => !(entry.model in limited))
    .slice(0, MAX_LEASE_MODELS)
    .map(({ model, price }) => storedCandidate(model, price));
  return {
    leaseId: newLeaseId(),
    secretHash,
    hour,
    state: "open",
    createdAt: now,
    expiresAt: now,
    requests: 0,
    tokens: 0,
    ids: 0,
    picos: budgeted ? 0n : null,
    reservedPicos: 0n,
    slots: 0,
    idsUsed: 0,
    models,
    endedAt: null,
    scope,
  };
}
