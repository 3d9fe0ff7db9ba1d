/**
 * The one rule for an origin that failed (docs/configuration.md, `origin_quarantine_ms`):
 * it is quarantined for a while and tried only after every healthy origin, as a last resort
 * rather than never; its next answer clears it. The edge's failover order and the Batcher's
 * origin choice both rank by it. Pure: time comes in as `now`.
 */

/** How long an origin that failed stays quarantined unless configured otherwise. */
export const DEFAULT_QUARANTINE_MS = 2_000;

/** Quarantine state of a set of origins, by id. */
export class OriginHealth {
  readonly #failedAt = new Map<string, number>();
  readonly quarantineMs: number;

  constructor(quarantineMs: number = DEFAULT_QUARANTINE_MS) {
    this.quarantineMs = quarantineMs;
  }

  /** The origin failed a request: it could not be reached, timed out, answered 5xx or broke off. */
  failed(id: string, now: number): void {
    this.#failedAt.set(id, now);
  }

  /** The origin answered: healthy again. */
  answered(id: string): void {
    this.#failedAt.delete(id);
  }

  /** Whether the origin is quarantined at `now`. */
  quarantined(id: string, now: number): boolean {
    const at = this.#failedAt.get(id);
    return at !== undefined && at + this.quarantineMs > now;
  }

  /** `items` healthy first, then quarantined; each group keeps its order. */
  rank<T>(items: readonly T[], idOf: (item: T) => string, now: number): T[] {
    const healthy: T[] = [];
    const quarantined: T[] = [];
    for (const item of items) {
      (this.quarantined(idOf(item), now) ? quarantined : healthy).push(item);
    }
    return healthy.concat(quarantined);
  }

  /** Forgets every failure. */
  clear(): void {
    this.#failedAt.clear();
  }
}
