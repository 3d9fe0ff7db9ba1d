/**
 * The ledger row of a request an isolate admitted under a lease (docs/key-account.md,
 * "Leased allowances"): it has none until it settles, or until its lease ended unsettled
 * and an origin says what it generated. Its reservation moves from the lease to the row.
 */
import { parseLeasedId } from "../../../contracts/lease-ids.ts";
import { HOUR_MS } from "../../../contracts/budget-periods.ts";
import { utcDay } from "../../../contracts/pricing.ts";
import {
  type LedgerEntry,
  NOT_CLOSED,
  type StoredCandidate,
  rowTags,
  storedCandidate,
} from "../schema.ts";
import type { AccountStore } from "../store.ts";
import type { SettleInput } from "../types.ts";

/**
 * The open row of a leased request, as of its admission, for its settlement to close; null
 * when the id names no lease of this key. Takes the request's reservation from its lease
 * (none once the lease ended: its money was given back then).
 */
export function leasedRow(
  store: AccountStore,
  input: SettleInput,
  now: number,
): LedgerEntry | null {
  const parsed = parseLeasedId(input.requestId);
  const lease = parsed === null ? undefined : store.leases.get(parsed.leaseId);
  if (parsed === null || lease === undefined) return null;
  const admitted = input.admitted?.models.map(({ model, price }) => storedCandidate(model, price));
  const named = lease.models[parsed.modelIndex];
  const candidates: StoredCandidate[] =
    admitted !== undefined && admitted.length > 0 ? admitted : named === undefined ? [] : [named];
  const first = candidates[0];
  if (first === undefined) return null;
  const asked = input.admitted?.reservedPicos ?? 0n;
  const reserved =
    lease.state === "ended" ? 0n : asked < lease.reservedPicos ? asked : lease.reservedPicos;
  if (reserved > 0n) {
    lease.reservedPicos -= reserved;
    store.leases.put(lease);
  }
  const usage = input.usage ?? null;
  // An end user's lease names its user even when the isolate never said (it died first).
  const subject = lease.scope?.subject ?? null;
  return {
    requestId: input.requestId,
    state: "open",
    model: first[0],
    day: utcDay(lease.hour * HOUR_MS),
    hour: lease.hour,
    subject: subject?.id ?? null,
    subjectTpm: subject?.limits.tpm ?? null,
    endUser: input.leased?.endUser ?? lease.scope?.endUser ?? null,
    tags: rowTags(store.key.record?.tags ?? [], input.tags),
    teamId: store.key.record?.teamId ?? null,
    // Its tokens came out of the buckets with the lease's; without the edge's word (an
    // origin's record) what it used is all it is charged.
    reservedTokens:
      input.leased?.reservedTokens ??
      (usage === null ? 0 : usage.prompt_tokens + usage.completion_tokens),
    reservedPicos: reserved,
    candidates,
    createdAt: input.leased?.admittedAt ?? lease.createdAt,
    expiresAt: now,
    ...NOT_CLOSED,
  };
}
