/**
 * The one credential check every path uses (admission, `check`, `usage`, `record`): which
 * live secret an API key or a browser token stands on, and how long a rotated-out secret
 * still lives. Pure: the secrets come in as values (docs/key-account.md).
 */
import { constantTimeEqual } from "../../contracts/hashing.ts";
import type { SecretRow } from "./schema.ts";
import type { AdmissionRefusal, CheckCredential } from "./types.ts";

type InvalidKeyRefusal = Extract<AdmissionRefusal, { code: "invalid_api_key" }>;

/**
 * The live secret a credential stands on: the one an API key matches, or the one a browser
 * token was minted with (its generation), so a token ends with that secret, to the
 * millisecond, whenever in a second it was minted.
 */
export function checkCredential(
  secrets: readonly SecretRow[],
  credential: CheckCredential,
  now: number,
): { ok: true; secretGeneration: number } | InvalidKeyRefusal {
  if (credential.kind === "key") {
    const secret = matchingSecret(secrets, credential.secretHash, now);
    if (secret !== null) return { ok: true, secretGeneration: secret.generation };
    return { ok: false, code: "invalid_api_key", reason: "bad_secret" };
  }
  const secret = secrets.find((row) => row.generation === credential.secretGeneration);
  if (secret !== undefined && live(secret, now)) {
    return { ok: true, secretGeneration: secret.generation };
  }
  return { ok: false, code: "invalid_api_key", reason: "rotated" };
}

/** The end of the grace of the latest rotated-out secret still live at `now`, or null. */
export function previousSecretValidUntil(
  secrets: readonly SecretRow[],
  now: number,
): number | null {
  let previous: number | null = null;
  for (const secret of secrets) {
    if (secret.valid_until !== null && secret.valid_until > now) {
      previous = Math.max(previous ?? 0, secret.valid_until);
    }
  }
  return previous;
}

// The live secret whose hash is `secretHash`, compared with every secret, without stopping
// at the first match.
function matchingSecret(
  secrets: readonly SecretRow[],
  secretHash: string,
  now: number,
): SecretRow | null {
  let match: SecretRow | null = null;
  for (const secret of secrets) {
    match = constantTimeEqual(secret.secret_hash, secretHash) && live(secret, now) ? secret : match;
  }
  return match;
}

function live(secret: SecretRow, now: number): boolean {
  return secret.valid_until === null || secret.valid_until > now;
}
