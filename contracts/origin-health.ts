/**
 * The one rule for an origin's health (docs/failover.md): an origin whose circuit breaker
 * is open or half-open takes no client request; one that failed a request lately is
 * quarantined for `origin_quarantine_ms` and tried only after every healthy origin, as a
 * last resort rather than never, until its next answer. The edge's failover order and the
 * Batcher's origin choice both rank by it. Pure: time comes in as `now`.
 */

/** How long an origin that failed stays quarantined unless configured otherwise. */
export const DEFAULT_QUARANTINE_MS = 2_000;

/** What the breakers say of an origin (see `breaker-cache.ts`). */
export interface BreakerGate {
  blocked(id: string): boolean;
}

const NO_BREAKERS: BreakerGate = { blocked: () => false };

/** Quarantine and breaker state of a set of origins, by id. */
export class OriginHealth {
  readonly #until = new Map<string, number>();
  readonly quarantineMs: number;
  readonly #breakers: BreakerGate;

  constructor(quarantineMs: number = DEFAULT_QUARANTINE_MS, breakers: BreakerGate = NO_BREAKERS) {
    this.quarantineMs = quarantineMs;
    this.#breakers = breakers;
  }

  /** Whether the origin may take client requests at all: its breaker lets them through. */
  usable(id: string): boolean {
    return !this.#breakers.blocked(id);
  }

  /**
   * The origin failed a request: it could not be reached, timed out, answered 5xx or broke
   * off. It is quarantined for `quarantineMs` (this rule's, unless given).
   */
  failed(id: string, now: number, quarantineMs: number = this.quarantineMs): void {
    this.#until.set(id, now + quarantineMs);
  }

  /** The origin answered: healthy again. */
  answered(id: string): void {
    this.#until.delete(id);
  }

  /** Whether the origin is quarantined at `now`. */
  quarantined(id: string, now: number): boolean {
    return (this.#until.get(id) ?? Number.NEGATIVE_INFINITY) > now;
  }

  /**
   * The usable `items`, healthy first, then quarantined; each group keeps its order. Those
   * whose breaker blocks them are left out.
   */
  rank<T>(items: readonly T[], idOf: (item: T) => string, now: number): T[] {
    const healthy: T[] = [];
    const quarantined: T[] = [];
    for (const item of items) {
      const id = idOf(item);
      if (!this.usable(id)) continue;
      (this.quarantined(id, now) ? quarantined : healthy).push(item);
    }
    return healthy.concat(quarantined);
  }

  /** Forgets every failure. */
  clear(): void {
    this.#until.clear();
  }
}
