/**
 * The credentials a Batcher presents to its origins (docs/failover.md, "Origin
 * credentials"): each origin's named secrets, in order of rotation, with one ring that moves
 * an origin to its next credential on a refusal.
 */
import { CredentialRing, credentialValues } from "../../../contracts/credentials.ts";
import type { CredentialedOrigin } from "../../../contracts/upstream.ts";
import type { BatcherSetup } from "../../../contracts/config/plans.ts";

/** Each origin as the upstream client calls it, with its credentials. */
export class OriginCredentials {
  readonly #env: Env;
  readonly #ring = new CredentialRing();

  constructor(env: Env) {
    this.#env = env;
  }

  /** An origin of `setup` with its credentials (the named secrets' values). */
  credentialed(setup: BatcherSetup | null, id: string, url: string): CredentialedOrigin {
    const names = setup?.origins.find((o) => o.id === id)?.credentials;
    return { id, url, credentials: credentialValues(this.#env, names), ring: this.#ring };
  }
}
