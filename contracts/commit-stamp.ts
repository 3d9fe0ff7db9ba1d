/**
 * The commit stamp: how a key account's answers tell the edge which of its writes are
 * durable (docs/key-account.md).
 */

/**
 * Where an answer of a key's account stands among its commits, so that the edge knows when
 * a settlement it carried is durable (see "Commits the edge can see" at the top of
 * docs/key-account.md; the key account answers with it).
 */
export interface CommitStamp {
  /** The account's run: random, new whenever it starts (or a commit fails). */
  incarnation: string;
  /** Commits of this incarnation that were durable when the answer left. */
  committed: number;
  /** The commit the writes of this call land in: `committed` when none wait to be written. */
  pending: number;
}
