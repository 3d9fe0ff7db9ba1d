/**
 * The key's record and secrets: created, changed, revoked and rotated at once (not written
 * behind), read into memory, and the one credential check every path uses (docs/key-account.md).
 */
import { constantTimeEqual } from "../../contracts/hashing.ts";
import { type RecordRow, type SecretRow, modelsColumn, recordOf } from "./schema.ts";
import type { AccountStore } from "./store.ts";
import type {
  AdmissionRefusal,
  CheckCredential,
  KeyCreateInput,
  KeyRecord,
  KeyUpdateInput,
} from "./types.ts";

type InvalidKeyRefusal = Extract<AdmissionRefusal, { code: "invalid_api_key" }>;

/** Creates the key; null when this object already holds one. */
export function createKey(store: AccountStore, input: KeyCreateInput): KeyRecord | null {
  if (store.record !== null) return null;
  const sql = store.storage.sql;
  store.storage.transactionSync(() => {
    sql.exec(
      `INSERT INTO key_record (singleton, id, name, status, rpm, tpm, concurrency, allowed_origins,
         models, tier, expires_at, created_at, updated_at, revoked_at, version,
         budget_day_micros, budget_month_micros, credit_micros, allow_region_override)
       VALUES (1, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 1, ?, ?, ?, ?)`,
      input.id,
      input.name,
      input.limits.rpm,
      input.limits.tpm,
      input.limits.concurrency,
      JSON.stringify(input.allowedOrigins),
      input.models === null ? null : JSON.stringify(input.models),
      input.tier,
      input.expiresAt,
      input.now,
      input.now,
      input.budgets?.dayMicros ?? null,
      input.budgets?.monthMicros ?? null,
      input.budgets?.creditMicros ?? null,
      input.allowRegionOverride === true ? 1 : 0,
    );
    sql.exec(
      `INSERT INTO secrets (secret_hash, generation, created_at, valid_until)
       VALUES (?, 1, ?, NULL)`,
      input.secretHash,
      input.now,
    );
  });
  loadKeyRecord(store);
  return store.record;
}

/** Applies a partial change; null when no key lives here. */
export function updateKey(store: AccountStore, input: KeyUpdateInput): KeyRecord | null {
  const current = store.record;
  if (current === null) return null;
  const limits = { ...current.limits, ...input.limits };
  const budgets = { ...current.budgets, ...input.budgets };
  store.storage.sql.exec(
    `UPDATE key_record SET name = ?, rpm = ?, tpm = ?, concurrency = ?, allowed_origins = ?,
       models = ?, tier = ?, expires_at = ?, updated_at = ?, version = version + 1,
       budget_day_micros = ?, budget_month_micros = ?, credit_micros = ?,
       allow_region_override = ?`,
    input.name ?? current.name,
    limits.rpm,
    limits.tpm,
    limits.concurrency,
    JSON.stringify(input.allowedOrigins ?? current.allowedOrigins),
    modelsColumn(input.models === undefined ? current.models : input.models),
    input.tier ?? current.tier,
    input.expiresAt === undefined ? current.expiresAt : input.expiresAt,
    input.now,
    budgets.dayMicros,
    budgets.monthMicros,
    budgets.creditMicros,
    (input.allowRegionOverride ?? current.allowRegionOverride) ? 1 : 0,
  );
  loadKeyRecord(store);
  return recordView(store, input.now);
}

/** Revokes the key: its very next request is refused. Null when no key lives here. */
export function revokeKey(store: AccountStore, now: number): KeyRecord | null {
  if (store.record === null) return null;
  if (store.record.status !== "revoked") {
    store.storage.sql.exec(
      "UPDATE key_record SET status = 'revoked', revoked_at = ?, updated_at = ?, version = version + 1",
      now,
      now,
    );
    loadKeyRecord(store);
  }
  return recordView(store, now);
}

/**
 * Makes `secretHash` the current secret; the previous one stays valid for `graceMs`.
 * Null when no key lives here or the key is revoked.
 */
export function rotateSecret(
  store: AccountStore,
  input: { secretHash: string; graceMs: number; now: number },
): KeyRecord | null {
  if (store.record === null || store.record.status === "revoked") return null;
  const sql = store.storage.sql;
  const { now } = input;
  store.storage.transactionSync(() => {
    sql.exec("DELETE FROM secrets WHERE valid_until IS NOT NULL AND valid_until <= ?", now);
    sql.exec(
      "UPDATE secrets SET valid_until = ? WHERE valid_until IS NULL",
      now + Math.max(0, input.graceMs),
    );
    // The current secret is never deleted, so generations only grow.
    sql.exec(
      `INSERT INTO secrets (secret_hash, generation, created_at, valid_until)
       SELECT ?, COALESCE(MAX(generation), 0) + 1, ?, NULL FROM secrets`,
      input.secretHash,
      now,
    );
    sql.exec("UPDATE key_record SET updated_at = ?, version = version + 1", now);
  });
  loadKeyRecord(store);
  return recordView(store, now);
}

export function loadKeyRecord(store: AccountStore): void {
  const row = store.storage.sql.exec<RecordRow>("SELECT * FROM key_record").toArray()[0];
  store.record = row === undefined ? null : recordOf(row);
  loadSecrets(store);
}

export function loadSecrets(store: AccountStore): void {
  store.secrets = store.storage.sql
    .exec<SecretRow>("SELECT secret_hash, generation, created_at, valid_until FROM secrets")
    .toArray();
}

export function recordView(store: AccountStore, now: number): KeyRecord | null {
  if (store.record === null) return null;
  let previous: number | null = null;
  for (const secret of store.secrets) {
    if (secret.valid_until !== null && secret.valid_until > now) {
      previous = Math.max(previous ?? 0, secret.valid_until);
    }
  }
  return { ...store.record, previousSecretValidUntil: previous };
}

/**
 * The live secret a credential stands on: the one an API key matches, or the one a browser
 * token was minted with (its generation), so a token ends with that secret, to the
 * millisecond, whenever in a second it was minted.
 */
export function checkSecret(
  store: AccountStore,
  credential: CheckCredential,
  now: number,
): { ok: true; secretGeneration: number } | InvalidKeyRefusal {
  if (credential.kind === "key") {
    const secret = matchingSecret(store, credential.secretHash, now);
    if (secret !== null) return { ok: true, secretGeneration: secret.generation };
    return { ok: false, code: "invalid_api_key", reason: "bad_secret" };
  }
  const secret = store.secrets.find((row) => row.generation === credential.secretGeneration);
  if (secret !== undefined && live(secret, now)) {
    return { ok: true, secretGeneration: secret.generation };
  }
  return { ok: false, code: "invalid_api_key", reason: "rotated" };
}

// The live secret whose hash is `secretHash`, compared with every secret, without stopping
// at the first match.
function matchingSecret(store: AccountStore, secretHash: string, now: number): SecretRow | null {
  let match: SecretRow | null = null;
  for (const secret of store.secrets) {
    match = constantTimeEqual(secret.secret_hash, secretHash) && live(secret, now) ? secret : match;
  }
  return match;
}

function live(secret: SecretRow, now: number): boolean {
  return secret.valid_until === null || secret.valid_until > now;
}
