/**
 * Admission of an API key's completion under its isolate's lease, or exactly in its
 * account when it does not fit (docs/edge.md, "Leased allowances"): the lease renewed in
 * the background before it runs out and trimmed before an exact admission; one the isolate
 * stops renewing lapses in the account. A request for an end user is admitted under that
 * user's own lease (docs/key-account.md, "End users' leases").
 */
import type { Context } from "hono";
import type { AppEnv } from "../app-env.ts";
import {
  type AdmitRequestInput,
  type Credential,
  admitRequest,
  callLease,
} from "../accounts/account-client.ts";
import { type LeaseScope, budgetsBarLease, leaseHolder } from "../../contracts/lease-scopes.ts";
import type { LeasedAdmission, LeaseCandidate, LocalRequest } from "../accounts/leases.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import type { LeaseAsk } from "../../durable-objects/key-account/leases/types.ts";
import type { AdmitResult } from "../../durable-objects/key-account/types.ts";
import { waitUntilOf } from "./request-context.ts";
import { sleep } from "../../contracts/sleep.ts";
import { SETTLE_LINGER_MS } from "../accounts/settle-queue.ts";
import type { EdgeState } from "../edge-state.ts";

/** A request the lease is asked to admit: its models with their allowances, its prompt. */
export function localRequest(
  candidates: readonly LeaseCandidate[],
  promptTokens: number,
  origin: string | null,
): LocalRequest {
  return { candidates, promptTokens, origin };
}

/** A lease of a key as the isolate names it: whose it is, and who holds it. */
interface LeaseRef {
  keyId: string;
  holder: string;
  scope: LeaseScope | null;
  /**
   * Its requests are admitted exactly, never under it: a browser token's that carries
   * budgets (a lease holds the key's money, not the end user's).
   */
  exact: boolean;
}

/**
 * The lease a request is admitted under: its key's, or its end user's own (a browser
 * token's user with the token's limits and models), so that its row names the user even
 * if its isolate dies before settling it.
 */
function leaseOf(credential: Credential, endUser: string | null): LeaseRef {
  if (credential.kind === "key") {
    return {
      keyId: credential.keyId,
      holder: leaseHolder(credential),
      scope: endUser === null ? null : { endUser, subject: null },
      exact: false,
    };
  }
  const { scope } = credential;
  return {
    keyId: credential.keyId,
    holder: leaseHolder({ kind: "browser", secretGeneration: scope.secretGeneration }),
    scope: { endUser, subject: { id: scope.subject, limits: scope.limits, models: scope.models } },
    exact: budgetsBarLease(scope.budgets),
  };
}

// The lease an exact admission asks about (trims, and may be granted): none for `exact`.
function askedLease(lease: LeaseRef | null): LeaseRef | null {
  return lease?.exact === true ? null : lease;
}

/** Admits the request under its lease in this isolate; null when it does not fit. */
export function admitUnderLease(
  c: Context<AppEnv>,
  request: LocalRequest,
  endUser: string | null,
): LeasedAdmission | null {
  const config = c.get("config");
  const edge = c.get("edge");
  if (!config.leases.enabled) return null;
  const lease = leaseOf(c.get("credential"), endUser);
  if (lease.exact) return null;
  const leased = edge.leases.admit(lease.keyId, lease.holder, lease.scope, request, Date.now());
  if (leased !== null) keepLease(c, endUser);
  return leased;
}

/**
 * Admits the request exactly in its account (one call), which first takes back what the
 * isolate's lease holds unused, so that it never stands in the way, and may grant a lease.
 */
export async function admitExactly(
  c: Context<AppEnv>,
  input: AdmitRequestInput,
  request: LocalRequest,
): Promise<AdmitResult> {
  const credential = c.get("credential");
  const lease = c.get("config").leases.enabled ? leaseOf(credential, input.endUser ?? null) : null;
  // Refused a slot while a request of the key runs here: its client may have left already,
  // unheard of until that stream's next write. Asked again as such requests end, a while;
  // an end heard while the call was under way counts, and one this request cannot use (its
  // end user's or team's limit refused it, or another) goes on to the next waiter.
  const requests = c.get("edge").keyRequests;
  const { keyId } = credential;
  const doneAsking = requests.asking(keyId);
  try {
    let askedAt = Date.now();
    let result = await admitTrimmed(c, input, request, lease);
    const until = Date.now() + CONCURRENCY_GRACE_MS;
    for (let i = 0; i < CONCURRENCY_RETRIES && concurrencyRefusal(result); i++) {
      const ended = await requests.whenOneEnds(keyId, until - Date.now(), askedAt);
      if (ended === null) break;
      askedAt = Date.now();
      result = (await admitOnce(c, input, askedLease(lease))).result;
      if (!result.ok && !keyConcurrencyRefusal(result)) requests.giveBack(keyId, ended);
    }
    return result;
  } finally {
    doneAsking();
  }
}

/**
 * How long a request refused for its key's concurrency waits for a request of the key in
 * this isolate to end: a stream's client that left is heard of at its next token, tens of
 * milliseconds apart. A client truly over its concurrency is refused that much later.
 */
export const CONCURRENCY_GRACE_MS = 250;
/** Most times it is asked again meanwhile (each an account call). */
const CONCURRENCY_RETRIES = 4;

// Refused because the key's own slots are all taken: the end it waited for was taken too.
function keyConcurrencyRefusal(result: AdmitResult): boolean {
  return concurrencyRefusal(result) && "scope" in result && result.scope === "key";
}

function concurrencyRefusal(result: AdmitResult): boolean {
  return (
    !result.ok &&
    result.code === "rate_limit_exceeded" &&
    result.limit === "concurrency" &&
    !result.tooLarge
  );
}

// One exact admission; where leases are on (`lease`), the key's leases here trimmed first.
async function admitTrimmed(
  c: Context<AppEnv>,
  input: AdmitRequestInput,
  request: LocalRequest,
  lease: LeaseRef | null,
): Promise<AdmitResult> {
  const config = c.get("config");
  const edge = c.get("edge");
  const own = askedLease(lease);
  if (own !== null) edge.leases.note(own.keyId, own.scope, request, Date.now());
  const first = await admitOnce(c, input, own);
  if (first.ok || lease === null || !limitRefusal(first.result)) return first.result;
  // The key's other leases in this isolate (its end users' or its own) may hold what the
  // request lacks: trimmed, and asked again. A request admitted exactly has none of its own.
  const others = edge.leases.others(lease.keyId, lease.scope, own === null);
  if (others.length === 0 && (first.trimmed || own === null)) return first.result;
  // Each, once a call about it under way answered, trimmed; then asked again.
  await Promise.all(
    others.map(async (other) => {
      await idle(edge, lease.keyId, other.scope);
      const options = leaseOptions(config, Date.now());
      await callLease(c.env, edge, { keyId: lease.keyId, ...other }, "trim", options);
    }),
  );
  // Refused while another call about its own lease was under way, so what it holds unused
  // may have stood in the way: once that call answered, asked again with the lease trimmed.
  if (own !== null) await idle(edge, own.keyId, own.scope);
  return (await admitOnce(c, input, own)).result;
}

// Waits, a while at most, until no call about a lease is under way.
async function idle(edge: EdgeState, keyId: string, scope: LeaseScope | null): Promise<void> {
  for (let i = 0; i < BUSY_POLLS && edge.leases.busy(keyId, scope); i++) {
    await sleep(BUSY_POLL_MS);
  }
}

// How long an exact admission waits, at most, for a call about its lease to answer.
const BUSY_POLLS = 100;
const BUSY_POLL_MS = 10;

function limitRefusal(result: AdmitResult): boolean {
  return (
    !result.ok && (result.code === "rate_limit_exceeded" || result.code === "insufficient_quota")
  );
}

// One exact admission call, trimming the lease when no other call about it is under way.
async function admitOnce(
  c: Context<AppEnv>,
  input: AdmitRequestInput,
  ref: LeaseRef | null,
): Promise<{ ok: boolean; trimmed: boolean; result: AdmitResult }> {
  const config = c.get("config");
  const credential = c.get("credential");
  const edge = c.get("edge");
  const now = Date.now();
  const ask =
    ref === null ? null : edge.leases.ask(ref.keyId, ref.scope, "trim", leaseOptions(config, now));
  const hash = ref?.holder ?? "";
  let answer: Awaited<ReturnType<typeof admitRequest>>;
  try {
    answer = await admitRequest(c.env, edge.settlements, credential, input, ask);
  } catch (error) {
    if (ask !== null) edge.leases.answered(credential.keyId, hash, ask, null, now);
    throw error;
  }
  const { lease, ...result } = answer;
  if (ask !== null) {
    // A key that refuses the credential (revoked, rotated, blocked) ends the lease here at once.
    const dropped =
      !result.ok && (result.code === "invalid_api_key" || result.code === "key_blocked");
    edge.leases.answered(credential.keyId, hash, ask, { lease: lease ?? null, dropped }, now);
  }
  return { ok: result.ok, trimmed: ask !== null, result };
}

/**
 * Renews the lease of the request's key (or of its end user) in the background when it
 * runs low or its window half passed.
 */
export function keepLease(c: Context<AppEnv>, endUser: string | null): void {
  const config = c.get("config");
  const edge = c.get("edge");
  const lease = leaseOf(c.get("credential"), endUser);
  const now = Date.now();
  if (lease.exact || !edge.leases.due(lease.keyId, lease.scope, config.leases.windowMs, now))
    return;
  waitUntilOf(c)(callLease(c.env, edge, lease, "renew", leaseOptions(config, now)));
}

/**
 * How long a request's settlement may wait for a call of its key to carry it (undefined:
 * the settle queue's usual 20 to 100 ms, for a request that holds a slot in its account). A
 * leased request holds no slot there (its lease does), so its bill waits the longest the
 * queue lingers ({@link SETTLE_LINGER_MS}) even when it is alone: one client's requests
 * tens of milliseconds apart then share a call instead of each costing one. While the
 * isolate holds leases of many keys, each of which would cost a call of its own that often,
 * its bill rides the lease's next renewal (due within half a window while traffic flows)
 * and goes on its own after half a window at most.
 */
export function settleWaitMs(c: Context<AppEnv>): number | undefined {
  if (c.get("leased") === undefined) return undefined;
  const { windowMs } = c.get("config").leases;
  return c.get("edge").leases.leasedKeys(Date.now()) > MANY_LEASED_KEYS
    ? windowMs / 2
    : SETTLE_LINGER_MS;
}

/**
 * Keys an isolate holds leases of above which their leased requests' bills ride renewals:
 * below it, each key's settlements cost a call every 100 ms at most, a bounded rate.
 */
export const MANY_LEASED_KEYS = 8;

/** A leased request ended (settled, or released when its client left): its slot is free. */
export function leaseEnded(c: Context<AppEnv>, leased: LeasedAdmission): void {
  c.get("edge").leases.ended(c.get("credential").keyId, leased.scope, leased.leaseId);
}

function leaseOptions(
  config: ResolvedConfig,
  now: number,
): { windowMs: number; models: LeaseAsk["models"]; now: number } {
  return {
    windowMs: config.leases.windowMs,
    models: config.models.map((model) => ({ model: model.id, price: model.price })),
    now,
  };
}
