/**
 * What a key's account tells a Batch API batch about its key (docs/batch-api.md,
 * "Lifecycle"), apart from the account's code so that the batch's pure core can name it.
 */

/** Why a batch's lines stop: its key was revoked, expired or blocked, or lost the model. */
export type BatchStop = "key_revoked" | "key_expired" | "key_blocked" | "model_not_allowed";
