/**
 * A plain pause, for waits that ride the runtime's own timers: gathering requests' asks and
 * settlements into one call, and pausing between tries (docs/edge.md, "Delivery").
 */

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
