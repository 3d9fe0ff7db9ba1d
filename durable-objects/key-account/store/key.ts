/**
 * The key's record and secrets (tables `key_record` and `secrets`): created, changed,
 * revoked and rotated at once (not written behind), and held in memory
 * (docs/key-account.md, "Storage").
 */
import { previousSecretValidUntil } from "../credential.ts";
import { type RecordRow, type SecretRow, modelsColumn, recordOf } from "../schema.ts";
import type { KeyCreateInput, KeyRecord, KeyUpdateInput } from "../types.ts";

/** The key's record and secrets, memory in step with SQLite. */
export class KeyStore {
  readonly #storage: DurableObjectStorage;
  #record: KeyRecord | null = null;
  #secrets: SecretRow[] = [];

  constructor(storage: DurableObjectStorage) {
    this.#storage = storage;
  }

  /** The key as stored (`previousSecretValidUntil` unset), or null when no key lives here. */
  get record(): KeyRecord | null {
    return this.#record;
  }

  /** Every secret still kept: the current one and the rotated-out ones in their grace. */
  get secrets(): readonly SecretRow[] {
    return this.#secrets;
  }

  /** Reads the record and the secrets (at start). */
  load(): void {
    const row = this.#storage.sql.exec<RecordRow>("SELECT * FROM key_record").toArray()[0];
    this.#record = row === undefined ? null : recordOf(row);
    this.#loadSecrets();
  }

  /** The record as answered at `now`, with its previous secret's grace; null without a key. */
  view(now: number): KeyRecord | null {
    if (this.#record === null) return null;
    return {
      ...this.#record,
      previousSecretValidUntil: previousSecretValidUntil(this.#secrets, now),
    };
  }

  /** Creates the key; null when this object already holds one. */
  create(input: KeyCreateInput): KeyRecord | null {
    if (this.#record !== null) return null;
    const sql = this.#storage.sql;
    this.#storage.transactionSync(() => {
      sql.exec(
        `INSERT INTO key_record (singleton, id, name, status, rpm, tpm, concurrency, allowed_origins,
           models, tier, expires_at, created_at, updated_at, revoked_at, version, budgets,
           credit_micros, allow_region_override, tags, metadata, model_limits, alert_webhook_url,
           team_id)
         VALUES (1, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 1, ?, ?, ?, ?, ?, ?, ?, ?)`,
        input.id,
        input.name,
        input.limits.rpm,
        input.limits.tpm,
        input.limits.concurrency,
        JSON.stringify(input.allowedOrigins),
        modelsColumn(input.models),
        input.tier,
        input.expiresAt,
        input.now,
        input.now,
        JSON.stringify(input.budgets?.periods ?? []),
        input.budgets?.creditMicros ?? null,
        input.allowRegionOverride === true ? 1 : 0,
        JSON.stringify(input.tags ?? []),
        JSON.stringify(input.metadata ?? {}),
        JSON.stringify(input.modelLimits ?? {}),
        input.alertWebhookUrl ?? null,
        input.teamId ?? null,
      );
      sql.exec(
        `INSERT INTO secrets (secret_hash, generation, created_at, valid_until)
         VALUES (?, 1, ?, NULL)`,
        input.secretHash,
        input.now,
      );
    });
    this.load();
    return this.#record;
  }

  /** Applies a partial change; null when no key lives here. */
  update(input: KeyUpdateInput): KeyRecord | null {
    const current = this.#record;
    if (current === null) return null;
    const limits = { ...current.limits, ...input.limits };
    const budgets = { ...current.budgets, ...input.budgets };
    // Revoking is final: a revoked key is neither blocked nor unblocked.
    const status =
      current.status === "revoked" || input.blocked === undefined
        ? current.status
        : input.blocked
          ? "blocked"
          : "active";
    const blockedAt = status !== "blocked" ? null : (current.blockedAt ?? input.now);
    this.#storage.sql.exec(
      `UPDATE key_record SET name = ?, rpm = ?, tpm = ?, concurrency = ?, allowed_origins = ?,
         models = ?, tier = ?, expires_at = ?, updated_at = ?, version = version + 1,
         budgets = ?, credit_micros = ?, allow_region_override = ?, status = ?, blocked_at = ?,
         tags = ?, metadata = ?, model_limits = ?, alert_webhook_url = ?, team_id = ?`,
      input.name ?? current.name,
      limits.rpm,
      limits.tpm,
      limits.concurrency,
      JSON.stringify(input.allowedOrigins ?? current.allowedOrigins),
      modelsColumn(input.models === undefined ? current.models : input.models),
      input.tier ?? current.tier,
      input.expiresAt === undefined ? current.expiresAt : input.expiresAt,
      input.now,
      JSON.stringify(budgets.periods),
      budgets.creditMicros,
      (input.allowRegionOverride ?? current.allowRegionOverride) ? 1 : 0,
      status,
      blockedAt,
      JSON.stringify(input.tags ?? current.tags),
      JSON.stringify(input.metadata ?? current.metadata),
      JSON.stringify(input.modelLimits ?? current.modelLimits),
      input.alertWebhookUrl === undefined ? current.alertWebhookUrl : input.alertWebhookUrl,
      input.teamId === undefined ? current.teamId : input.teamId,
    );
    this.load();
    return this.view(input.now);
  }

  /** Revokes the key: its very next request is refused. Null when no key lives here. */
  revoke(now: number): KeyRecord | null {
    if (this.#record === null) return null;
    if (this.#record.status !== "revoked") {
      this.#storage.sql.exec(
        "UPDATE key_record SET status = 'revoked', revoked_at = ?, blocked_at = NULL, updated_at = ?, version = version + 1",
        now,
        now,
      );
      this.load();
    }
    return this.view(now);
  }

  /**
   * Makes `secretHash` the current secret; the previous one stays valid for `graceMs`.
   * Null when no key lives here or the key is revoked.
   */
  rotate(input: { secretHash: string; graceMs: number; now: number }): KeyRecord | null {
    if (this.#record === null || this.#record.status === "revoked") return null;
    const sql = this.#storage.sql;
    const { now } = input;
    this.#storage.transactionSync(() => {
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
    this.load();
    return this.view(now);
  }

  /** Deletes the rotated-out secrets whose grace has ended. */
  prune(now: number): void {
    this.#storage.sql.exec(
      "DELETE FROM secrets WHERE valid_until IS NOT NULL AND valid_until <= ?",
      now,
    );
    this.#loadSecrets();
  }

  #loadSecrets(): void {
    this.#secrets = this.#storage.sql
      .exec<SecretRow>("SELECT secret_hash, generation, created_at, valid_until FROM secrets")
      .toArray();
  }
}
