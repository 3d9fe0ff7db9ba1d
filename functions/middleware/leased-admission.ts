/**
 * Admission of an API key's completion under its isolate's lease, or exactly in its
 * account when it does not fit (docs/edge.md, "Leased allowances"): the lease renewed in
 * the background before it runs out and trimmed before an exact admission; one the isolate
 * stops renewing lapses in the account.
 */
import type { Context } from "hono";
import type { AppEnv } from "../app-env.ts";
import { type AdmitRequestInput, admitRequest, callLease } from "../accounts/account-client.ts";
import type { LeasedAdmission, LeaseCandidate, LocalRequest } from "../accounts/leases.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import type { LeaseAsk } from "../../durable-objects/key-account/leases/types.ts";
import type { AdmitResult } from "../../durable-objects/key-account/types.ts";
import { waitUntilOf } from "./request-context.ts";

/** A request the lease is asked to admit: its models with their allowances, its prompt. */
export function localRequest(
  candidates: readonly LeaseCandidate[],
  promptTokens: number,
  origin: string | null,
): LocalRequest {
  return { candidates, promptTokens, origin };
}

/** Admits the request under its key's lease in this isolate; null when it does not fit. */
export function admitUnderLease(
  c: Context<AppEnv>,
  request: LocalRequest,
  endUser: string | null,
): LeasedAdmission | null {
  const config = c.get("config");
  const credential = c.get("credential");
  const edge = c.get("edge");
  if (!config.leases.enabled || credential.kind !== "key") return null;
  // A request recorded for an end user is admitted exactly: its row names the user even
  // if its isolate dies before settling it.
  if (endUser !== null) return null;
  const leased = edge.leases.admit(credential.keyId, credential.secretHash, request, Date.now());
  if (leased !== null) keepLease(c);
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
  const config = c.get("config");
  const credential = c.get("credential");
  const edge = c.get("edge");
  const leasing = config.leases.enabled && credential.kind === "key";
  if (leasing) edge.leases.note(credential.keyId, request, Date.now());
  const first = await admitOnce(c, input, leasing);
  if (first.ok || first.trimmed || !leasing || !limitRefusal(first.result)) return first.result;
  // Refused while another call about the lease was under way, so what it holds unused may
  // have stood in the way: once that call answered, asked again with the lease trimmed.
  for (let i = 0; i < BUSY_POLLS && edge.leases.busy(credential.keyId); i++) {
    await new Promise((resolve) => setTimeout(resolve, BUSY_POLL_MS));
  }
  return (await admitOnce(c, input, leasing)).result;
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
  leasing: boolean,
): Promise<{ ok: boolean; trimmed: boolean; result: AdmitResult }> {
  const config = c.get("config");
  const credential = c.get("credential");
  const edge = c.get("edge");
  const now = Date.now();
  const ask = leasing ? edge.leases.ask(credential.keyId, "trim", leaseOptions(config, now)) : null;
  const hash = credential.kind === "key" ? credential.secretHash : "";
  let answer: Awaited<ReturnType<typeof admitRequest>>;
  try {
    answer = await admitRequest(c.env, edge.settlements, credential, input, ask);
  } catch (error) {
    if (ask !== null) edge.leases.answered(credential.keyId, hash, ask, null, now);
    throw error;
  }
  const { lease, ...result } = answer;
  if (ask !== null) {
    // A key that refuses the credential (revoked, rotated) ends the lease here at once.
    const dropped = !result.ok && result.code === "invalid_api_key";
    edge.leases.answered(credential.keyId, hash, ask, { lease: lease ?? null, dropped }, now);
  }
  return { ok: result.ok, trimmed: ask !== null, result };
}

/** Renews the key's lease in the background when it runs low or its window half passed. */
export function keepLease(c: Context<AppEnv>): void {
  const config = c.get("config");
  const credential = c.get("credential");
  const edge = c.get("edge");
  if (credential.kind !== "key") return;
  const now = Date.now();
  if (!edge.leases.due(credential.keyId, config.leases.windowMs, now)) return;
  const options = leaseOptions(config, now);
  waitUntilOf(c)(callLease(c.env, edge, credential.keyId, credential.secretHash, "renew", options));
}

/** A leased request ended (settled, or released when its client left): its slot is free. */
export function leaseEnded(c: Context<AppEnv>, leased: LeasedAdmission): void {
  const credential = c.get("credential");
  const edge = c.get("edge");
  if (credential.kind === "key") edge.leases.ended(credential.keyId, leased.leaseId);
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
