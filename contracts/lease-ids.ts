/**
 * The request ids of a key's lease (docs/key-account.md, "Leased allowances"): an isolate
 * names each request it admits under a lease `req_<lease><model><seq>`, still `req_` and
 * 32 hex digits like every request id, so that the key's account can ask the origins about
 * every request a lease could have admitted by the prefix they share.
 */

/** Hex digits of a lease id, of the model index and of the sequence number. */
const LEASE_DIGITS = 16;
const MODEL_DIGITS = 4;
const SEQ_DIGITS = 12;

/** The most models a lease's price table holds (the index fits its digits). */
export const MAX_LEASE_MODELS = 16 ** MODEL_DIGITS;

/** A new lease id: 64 random bits. */
export function newLeaseId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(LEASE_DIGITS / 2));
  return [...bytes].map((byte) => byte.toString(16).padStart(2, "0")).join("");
}

/** The id of a lease's `seq`-th request, served first by the lease's `modelIndex`-th model. */
export function leasedRequestId(leaseId: string, modelIndex: number, seq: number): string {
  return `req_${leaseId}${modelIndex.toString(16).padStart(MODEL_DIGITS, "0")}${seqDigits(seq)}`;
}

/**
 * The last digits of a leased request id for sequence number `seq`: fixed width, so ids
 * order by them as their numbers do (for SQL, `substr(request_id, -SEQ_DIGITS)`).
 */
export function seqDigits(seq: number): string {
  return seq.toString(16).padStart(SEQ_DIGITS, "0");
}

/** How many digits end a leased request id, its sequence number. */
export const LEASE_SEQ_DIGITS = SEQ_DIGITS;

/** The lease, model index and sequence number a request id names; null for any other id. */
export function parseLeasedId(
  requestId: string,
): { leaseId: string; modelIndex: number; seq: number } | null {
  if (!/^req_[0-9a-f]{32}$/.test(requestId)) return null;
  const hex = requestId.slice(4);
  return {
    leaseId: hex.slice(0, LEASE_DIGITS),
    modelIndex: Number.parseInt(hex.slice(LEASE_DIGITS, LEASE_DIGITS + MODEL_DIGITS), 16),
    seq: Number.parseInt(hex.slice(LEASE_DIGITS + MODEL_DIGITS), 16),
  };
}

/** What every request id of a lease starts with (`req_` and its 16 hex digits). */
export function leaseIdPrefix(leaseId: string): string {
  return `req_${leaseId}`;
}

/** The first and past-the-last request id of a lease, as a range of strings (for SQL). */
export function leaseIdRange(leaseId: string): [from: string, to: string] {
  return [leaseIdPrefix(leaseId), `${leaseIdPrefix(leaseId)}g`];
}
