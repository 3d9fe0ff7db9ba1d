/**
 * What an attempt generated when its END never reached the edge (docs/key-account.md,
 * "Billing every outcome"): its origin's outcome record, asked before the request is
 * settled, with the item cancelled there should it still run. The rule that picks the
 * attempt to bill is `contracts/outcomes.ts`'s, shared with the key accounts.
 */
import { logWarn } from "../../contracts/log.ts";
import {
  type AttemptEnd,
  type SettledOutcomeOptions,
  cancelItems,
  outranks,
  settledOutcome,
} from "../../contracts/outcomes.ts";
import type { ItemOutcome, ItemUsage } from "../../contracts/protocol/schema.ts";
import type { OriginConfig } from "../../contracts/config/regions.ts";
import type { RegionOrigin } from "./origin-pool.ts";
import type { GivenUp, SettledRequest } from "../accounts/settlement.ts";

/**
 * How long a streamed answer waits for its END after its client went away, and a whole one
 * cancelled for its client, before its origin is asked instead.
 */
export const END_WAIT_MS = 5_000;

/**
 * How the edge asks: an origin gets a second to answer (a whole answer's client, and the
 * request's settlement, wait for it), an item still running there a few tries to end.
 */
export const ORIGIN_ASK: SettledOutcomeOptions = { tries: 3, intervalMs: 200, timeoutMs: 1_000 };

/**
 * What the origins said: the usage to bill (null: nothing generated), how that attempt
 * ended and the origin that generated it, or not known yet.
 */
export type Generated =
  | {
      known: true;
      usage: ItemUsage | null;
      outcome: ItemOutcome | null;
      origin: string | null;
      /** From the item's arrival at its origin to its first body byte, when it told. */
      ttftMs?: number | null;
    }
  | { known: false };

const NOTHING: Generated = { known: true, usage: null, outcome: null, origin: null };

/** The settlement fields of what was generated. */
export function billed(generated: Generated): Pick<SettledRequest, "usage" | "usageUnknown"> {
  return generated.known ? { usage: generated.usage } : { usage: null, usageUnknown: true };
}

/**
 * What request `requestId`'s items `itemIds` generated on `origins`, by their outcome
 * records; an item still running is cancelled there first. Nothing when every origin
 * answered and none remembers it, or when `gone` (none could be reached by its attempt
 * either: an origin down took its record with it, and an outage costs its client nothing);
 * unknown while an item would not end, or while an origin that may remember it did not
 * answer (a slow origin still holds its record): then the key's account asks again, and
 * the request's slot is not held meanwhile.
 */
export async function generatedBy(
  origins: readonly OriginConfig[],
  requestId: string,
  itemIds: readonly string[],
  secrets: object,
  options: SettledOutcomeOptions = ORIGIN_ASK,
  gone = false,
): Promise<Generated> {
  if (origins.length === 0 || itemIds.length === 0) return NOTHING;
  const { found, complete } = await settledOutcome(origins, requestId, itemIds, secrets, options);
  // A silent origin may hold an attempt that outranks what the others remember, unless one
  // finished (`complete` then) or it is `gone`.
  const settled = complete || gone;
  if (found.kind === "ended" && settled) {
    const { usage, outcome, origin, ttftMs } = found;
    return { known: true, usage, outcome, origin, ...(ttftMs !== undefined && { ttftMs }) };
  }
  if (found.kind === "unknown" && settled) return NOTHING;
  const why = found.kind === "running" ? "origin item would not end" : "origin did not answer";
  logWarn(why, { request_id: requestId });
  return { known: false };
}

/** What a served attempt generated, and where. */
export type ServedBill = Pick<SettledRequest, "usage" | "usageUnknown" | "origin" | "region"> & {
  /** How it ended at its origin (null: no END told). */
  outcome: ItemOutcome | null;
};

/**
 * What a request served by an attempt that did not finish is billed (docs/key-account.md,
 * "Billing every outcome"): its own usage, or that of an attempt it gave up on before, when
 * the rule of `contracts/outcomes.ts` picks that one (it finished, or generated more). An
 * answer that finished is billed as it is, without asking.
 */
export async function servedOrGivenUp(
  own: ServedBill,
  requestId: string,
  gaveUp: readonly GivenUp[],
  secrets: object,
): Promise<ServedBill> {
  if (own.outcome === "ok" || own.usageUnknown === true || gaveUp.length === 0) return own;
  const { generated: other, region } = await givenUpGenerated(requestId, gaveUp, secrets);
  // What an attempt given up on generated is not known yet, so neither is the bill: one
  // that outranks this one may be held by a slow origin (the key's account asks the origins
  // about every attempt later, by the same rule).
  if (!other.known) return { ...own, usageUnknown: true };
  if (other.usage === null || other.outcome === null) return own;
  const mine: AttemptEnd = { outcome: own.outcome ?? "error", usage: own.usage };
  if (!outranks({ outcome: other.outcome, usage: other.usage }, mine)) return own;
  return { usage: other.usage, outcome: other.outcome, origin: other.origin, region };
}

/** What the attempts given up on generated, and the region of the origin that did. */
async function givenUpGenerated(
  requestId: string,
  gaveUp: readonly GivenUp[],
  secrets: object,
): Promise<{ generated: Generated; region: string | null }> {
  const origins = [...new Set(gaveUp.map((attempt) => attempt.origin))];
  const itemIds = gaveUp.map((attempt) => attempt.itemId);
  const gone = gaveUp.every((attempt) => attempt.unreachable === true);
  const generated = await generatedBy(origins, requestId, itemIds, secrets, ORIGIN_ASK, gone);
  const origin = generated.known ? generated.origin : null;
  const region = gaveUp.find((attempt) => attempt.origin.id === origin)?.region ?? null;
  return { generated, region };
}

// The client waits for the cancel of what its refusal gave up on: this long at most.
const GIVEN_UP_CANCEL_MS = 500;

/**
 * Cancels attempts the edge gave up on, on their origins, before the request is refused:
 * an origin remembers a cancel for an item that has not reached it yet.
 */
export async function cancelGivenUp(gaveUp: readonly GivenUp[], secrets: object): Promise<void> {
  const origins = [...new Set(gaveUp.map((attempt) => attempt.origin))];
  await Promise.all(
    origins.map((origin) => {
      const ids = gaveUp.filter((a) => a.origin === origin).map((attempt) => attempt.itemId);
      return cancelItems(origin, ids, secrets, GIVEN_UP_CANCEL_MS);
    }),
  );
}

/**
 * A request that ended without an answer from any origin, billed for what the attempts it
 * gave up on generated (the attempt that finished, else the one that generated the most);
 * as it was when they generated nothing.
 */
export async function unservedUsage(
  record: SettledRequest,
  gaveUp: readonly GivenUp[],
  secrets: object,
): Promise<SettledRequest> {
  const { generated, region } = await givenUpGenerated(record.requestId, gaveUp, secrets);
  if (generated.known && generated.usage === null) return record;
  const origin = generated.known ? generated.origin : null;
  return { ...record, ...billed(generated), origin, region, originBegan: true };
}

/** The configured origins named `ids` among `candidates` (each once). */
export function originsNamed(
  candidates: readonly RegionOrigin[],
  ids: readonly string[],
): OriginConfig[] {
  const found = new Map<string, OriginConfig>();
  for (const { origin } of candidates) {
    if (ids.includes(origin.id)) found.set(origin.id, origin);
  }
  return [...found.values()];
}

/**
 * Attempt `itemId`, given up on at origin `originId` (none for an origin not configured), or
 * at any origin of region `region` when which one is not known (a Batcher's item).
 */
export function givenUpAt(
  candidates: readonly RegionOrigin[],
  originId: string | null,
  itemId: string,
  region: string,
): GivenUp[] {
  const at = candidates.filter((candidate) =>
    originId === null ? candidate.region.id === region : candidate.origin.id === originId,
  );
  return (originId === null ? at : at.slice(0, 1)).map((candidate) => ({
    region: candidate.region.id,
    origin: candidate.origin,
    itemId,
  }));
}
