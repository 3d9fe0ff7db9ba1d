/**
 * What an edge isolate remembers of the batchers it sends through (docs/batching.md,
 * "Settings": `idle_bypass_ms`, `wait_share`); held by the isolate's `EdgeState`.
 */

/** What an isolate remembers of its batchers, by region, model and batching version. */
export class BatcherMemo {
  /**
   * When each batcher (by name without shard) last sent one of this isolate's requests at
   * once. A cache: losing it only costs a batcher call.
   */
  readonly sentAtOnce = new Map<string, number>();
  /**
   * A moving average of how long requests waited for their HEAD from the start of their
   * dispatch, which the batcher's window weighs (see `wait_share`).
   */
  readonly firstByteMs = new Map<string, number>();
  /**
   * Batchers (by full name) known to hold their settings: calls to them leave the settings
   * out. A cache: one that lost them answers `setup_needed` and is sent them again.
   */
  readonly holdingSetup = new Set<string>();
}
