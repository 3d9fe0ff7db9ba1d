/** The contract of the `KeyDirectory` (docs/key-account.md): its one instance's name. */

/** The name of the single directory instance. */
export const DIRECTORY_NAME = "key-directory";
