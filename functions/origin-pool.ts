/**
 * Spreads requests over the origins of each region and steps around origins that failed
 * recently. The state is a per-isolate cache (in-flight counts, recent failures); durable
 * circuit breakers replace it later. Pure: time comes in as `now`.
 */
import { type OriginConfig, type RegionConfig, originServes } from "./config.ts";

/** How long an origin that failed is tried only after every healthy one. */
export const ORIGIN_QUARANTINE_MS = 5_000;

/** One origin to try, with the region it belongs to. */
export interface OriginCandidate {
  region: RegionConfig;
  origin: OriginConfig;
}

/** In-isolate view of origin load and health. */
export class OriginPool {
  #inFlight = new Map<string, number>();
  #failedUntil = new Map<string, number>();
  #turn = 0;

  /**
   * Every origin serving `model`, in the order to try them: region by region, each
   * region's healthy origins least-loaded first (ties rotate, so load spreads round robin),
   * and origins that failed recently last, as a final resort rather than never.
   */
  candidates(regions: readonly RegionConfig[], model: string, now: number): OriginCandidate[] {
    const turn = this.#turn++;
    const healthy: OriginCandidate[] = [];
    const quarantined: OriginCandidate[] = [];
    for (const region of regions) {
      const serving = region.origins.filter((origin) => originServes(origin, model));
      const start = serving.length === 0 ? 0 : turn % serving.length;
      const rotated = [...serving.slice(start), ...serving.slice(0, start)];
      const ready: OriginCandidate[] = [];
      for (const origin of rotated) {
        const until = this.#failedUntil.get(origin.id);
        if (until !== undefined && until > now) quarantined.push({ region, origin });
        else ready.push({ region, origin });
      }
      // Array.prototype.sort is stable, so equal loads keep the rotated order.
      ready.sort((a, b) => this.inFlight(a.origin.id) - this.inFlight(b.origin.id));
      healthy.push(...ready);
    }
    return [...healthy, ...quarantined];
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

  /** The origin failed before answering: try it last for a while. */
  reportFailure(originId: string, now: number): void {
    this.#failedUntil.set(originId, now + ORIGIN_QUARANTINE_MS);
  }

  /** The origin answered: it is healthy again. */
  reportSuccess(originId: string): void {
    this.#failedUntil.delete(originId);
  }
}
