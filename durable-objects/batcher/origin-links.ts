/**
 * What a Batcher knows of its origins beyond the window (docs/failover.md): their circuit
 * breakers, as a cached copy reported to and refreshed from the region's `OriginBreakers`,
 * and the credentials it presents to each, rotating on a refusal.
 */
import type { BreakerRegion, BreakerView, Verdict } from "../../contracts/breaker.ts";
import { BreakerCache } from "../../contracts/breaker-cache.ts";
import { CredentialRing, credentialValues } from "../../contracts/credentials.ts";
import type { CredentialedOrigin } from "../../contracts/upstream.ts";
import type { BatcherSetup } from "../../contracts/config/plans.ts";

export class OriginLinks {
  readonly breakers: BreakerCache;
  readonly #ring = new CredentialRing();
  readonly #env: Env;
  readonly #waitUntil: (work: Promise<unknown>) => void;

  constructor(
    env: Env,
    waitUntil: (work: Promise<unknown>) => void,
    onChange: (changed: BreakerView[]) => void,
  ) {
    this.#env = env;
    this.#waitUntil = waitUntil;
    this.breakers = new BreakerCache(
      (region, reports) => env.ORIGIN_BREAKERS.getByName(region.id).report(region, reports),
      { onChange },
    );
  }

  /** An origin of `setup` with its credentials (the named secrets' values). */
  credentialed(setup: BatcherSetup | null, id: string, url: string): CredentialedOrigin {
    const names = setup?.origins.find((o) => o.id === id)?.credentials;
    return { id, url, credentials: credentialValues(this.#env, names), ring: this.#ring };
  }

  /** Tells the origin's breaker what a call showed of it. */
  outcome(setup: BatcherSetup | null, origin: string, verdict: Verdict): void {
    if (setup === null || !setup.breakers.enabled) return;
    const sync = this.breakers.record(regionOf(setup), origin, verdict, Date.now());
    if (sync !== null) this.#waitUntil(sync);
  }

  /** Brings the copy of the setup's breakers up to date now; false where breakers are off. */
  async refresh(setup: BatcherSetup): Promise<boolean> {
    if (!setup.breakers.enabled) return false;
    await this.breakers.refresh(regionOf(setup), Date.now());
    return true;
  }

  /** Refreshes the copy of the setup's breakers when due. */
  sync(setup: BatcherSetup, now: number): void {
    if (!setup.breakers.enabled) return;
    const sync = this.breakers.sync(regionOf(setup), now);
    if (sync !== null) this.#waitUntil(sync);
  }
}

/** The region of a setup as its breakers know it. */
function regionOf(setup: BatcherSetup): BreakerRegion {
  return {
    id: setup.region,
    origins: setup.origins.map((o) => ({ id: o.id, url: o.url })),
    settings: setup.breakers.settings,
  };
}
