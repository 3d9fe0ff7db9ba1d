/**
 * The bearer credentials the edge presents to an origin (docs/failover.md, "Origin
 * credentials"): several per origin, the names of secrets, used in order. A 401 or 429 from
 * an origin moves that origin to its next credential; a credential is never logged and
 * never reaches a client.
 */

/** The credential secrets' names of an origin when it names none. */
export const DEFAULT_CREDENTIALS: readonly string[] = ["ORIGIN_TOKEN"];

/** The values of the secrets `names` in `env`, in order; unset ones are left out. */
export function credentialValues(env: object, names: readonly string[] | undefined): string[] {
  const secrets = env as Record<string, unknown>;
  const values: string[] = [];
  for (const name of names ?? DEFAULT_CREDENTIALS) {
    const value = secrets[name];
    if (typeof value === "string" && value !== "") values.push(value);
  }
  return values;
}

/** Which credential each origin is on. */
export class CredentialRing {
  readonly #at = new Map<string, number>();

  /** The credential to present to `origin`, or undefined when it has none. */
  current(origin: string, credentials: readonly string[]): string | undefined {
    if (credentials.length === 0) return undefined;
    return credentials[(this.#at.get(origin) ?? 0) % credentials.length];
  }

  /**
   * The origin refused `used` (401 or 429): it moves to its next credential, unless another
   * refusal moved it already. Answers whether that next one is worth a try now.
   */
  refused(origin: string, credentials: readonly string[], used: string | undefined): boolean {
    if (credentials.length < 2) return false;
    if (this.current(origin, credentials) === used) {
      this.#at.set(origin, ((this.#at.get(origin) ?? 0) + 1) % credentials.length);
    }
    return this.current(origin, credentials) !== used;
  }
}

/** Whether an origin's status says the credential was refused. */
export function credentialRefused(status: number): boolean {
  return status === 401 || status === 429;
}
