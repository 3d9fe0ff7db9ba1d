/**
 * Tags and metadata of a key (docs/key-account.md, the schema of the key record and the ledger): what a tag may
 * be, how many a key and a request carry, and the values metadata holds.
 */

/** A tag: on a key, on a request (`x-warmgate-tags`) and on its ledger row. */
export const TAG_PATTERN = /^[A-Za-z0-9_.:=/@+-]{1,64}$/;
/** Most tags a key carries. */
export const MAX_KEY_TAGS = 32;
/** Most tags one request names in `x-warmgate-tags`. */
export const MAX_REQUEST_TAGS = 16;

/** A value of a key's free metadata. */
export type MetadataValue = string | number | boolean | null;
