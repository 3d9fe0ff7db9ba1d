/**
 * A plain pause on the runtime's own timers, the one the edge and the origin server use:
 * gathering asks and settlements into one call, pausing between tries, polling a moment for a
 * slot or a lease call to free (docs/edge.md, "Delivery").
 */

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
