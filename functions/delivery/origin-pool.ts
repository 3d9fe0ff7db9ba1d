/**
 * Spreads requests over the origins of each region and steps around origins that failed
 * recently, by the rule of `contracts/origin-health.ts`. The state is a per-isolate cache
 * (in-flight counts, recent failures). Pure: time comes in as `now`.
 * See docs/edge.md, "Delivery".
 */
import { OriginHealth } from "../../contracts/origin-health.ts";
import {
  type OriginConfig,
  type RegionConfig,
  originServes,
} from "../../contracts/config/regions.ts";

/** One origin to try, with the region it belongs to. */
export interface RegionOrigin {
  region: RegionConfig;
  origin: OriginConfig;
}

/** In-isolate view of origin load and health. */
export class OriginPool {
  #inFlight = new Map<string, number>();
  readonly #health: OriginHealth;
  #turn = 0;

  constructor(health: OriginHealth = new OriginHealth()) {
    this.#health = health;
  }

  /**
   * Every origin serving `model`, in the order to try them: region by region, each
   * region's healthy origins least-loaded first (ties rotate, so load spreads round robin),
   * and origins that failed recently last, as a final resort rather than never.
   */
  candidates(regions: readonly RegionConfig[], model: string, now: number): RegionOrigin[] {
    const turn = this.#turn++;
    const ordered: RegionOrigin[] = [];
    for (const region of regions) {
      const serving = region.origins.filter((origin) => originServes(origin, model));
      const start = serving.length === 0 ? 0 : turn % serving.length;
      const rotated = [...serving.slice(start), ...serving.slice(0, start)];
      // Array.prototype.sort is stable, so equal loads keep the rotated order.
      rotated.sort((a, b) => this.inFlight(a.id) - this.inFlight(b.id));
      ordered.push(...rotated.map((origin) => ({ region, origin })));
    }
    // Quarantined origins go after every healthy one, in every region.
    return this.#health.rank(ordered, (c) => c.origin.id, now);
  }

  /** `candidates` with those quarantined or busy at `now` last, each group in its order. */
  rerank(candidates: readonly RegionOrigin[], now: number): RegionOrigin[] {
    return this.#health.rank(candidates, (c) => c.origin.id, now);
  }

  /** The region's origins whose breaker keeps requests away (a Batcher must not pick them). */
  blocked(region: RegionConfig): string[] {
    return region.origins.filter((o) => !this.#health.usable(o.id)).map((o) => o.id);
  }

  /** Requests this isolate has running on an origin. */
  inFlight(originId: string): number {
    return this.#inFlight.get(originId) ?? 0;
  }

  /** A request started on the origin. */
  begin(originId: string): void {
    this.#inFlight.set(originId, this.inFlight(originId) + 1);
  }

  /** A request on the origin finished, however it ended. */
  end(originId: string): void {
    const count = this.inFlight(originId) - 1;
    if (count > 0) this.#inFlight.set(originId, count);
    else this.#inFlight.delete(originId);
  }

  /** The origin failed before answering: try it last for a while (`quarantineMs`). */
  reportFailure(originId: string, now: number, quarantineMs?: number): void {
    this.#health.failed(originId, now, quarantineMs);
  }

  /** The origin refused for overload (429, or 503 with `retry-after`): tried last meanwhile. */
  reportBusy(originId: string, now: number, headers: Record<string, string>): void {
    this.#health.busy(originId, now, headers);
  }

  /** Whether the origin refused for overload and its `retry-after` has not ended at `now`. */
  busy(originId: string, now: number): boolean {
    return this.#health.busyAt(originId, now);
  }

  /** The origin answered: it is healthy again. */
  reportSuccess(originId: string): void {
    this.#health.answered(originId);
  }

  /**
   * Every origin serving `model` is behind an open breaker: one of them, at most once per
   * `PANIC_INTERVAL_MS` in this isolate (see `OriginHealth.panic`), or none.
   */
  panic(regions: readonly RegionConfig[], model: string, now: number): RegionOrigin[] {
    const all = regions.flatMap((region) =>
      region.origins.filter((o) => originServes(o, model)).map((origin) => ({ region, origin })),
    );
    const pick = this.#health.panic(all, (c) => c.origin.id, now);
    return pick === null ? [] : [pick];
  }
}
