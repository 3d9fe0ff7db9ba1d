/**
 * The signature of a soft-budget alert (docs/key-account.md, "Soft budgets and alerts"):
 * `x-warmgate-signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` under the
 * `ALERT_SIGNING_SECRET`, made afresh for every attempt; a receiver recomputes it over the
 * raw body and refuses a timestamp older than it tolerates (replays).
 */
import { constantTimeEqual, hex, hmacSha256 } from "./hashing.ts";

/** The header that carries an alert's signature. */
export const ALERT_SIGNATURE_HEADER = "x-warmgate-signature";

/** The signature header's value for `body` sent at `unixSeconds`. */
export async function signAlert(
  secret: string,
  unixSeconds: number,
  body: string,
): Promise<string> {
  return `t=${unixSeconds},v1=${hex(await hmacSha256(secret, `${unixSeconds}.${body}`))}`;
}

/**
 * Whether `header` signs `body` under `secret`, no more than `toleranceS` seconds before
 * `nowS` (what a receiver checks).
 */
export async function verifyAlert(
  secret: string,
  header: string,
  body: string,
  nowS: number,
  toleranceS = 300,
): Promise<boolean> {
  const parts = new Map(header.split(",").map((part) => part.split("=", 2) as [string, string]));
  const t = Number(parts.get("t"));
  const v1 = parts.get("v1");
  if (!Number.isInteger(t) || v1 === undefined || Math.abs(nowS - t) > toleranceS) return false;
  const expected = hex(await hmacSha256(secret, `${t}.${body}`));
  return constantTimeEqual(expected, v1);
}
