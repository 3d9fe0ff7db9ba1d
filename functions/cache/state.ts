/**
 * What the response cache decided and did for one request, kept on the request's context
 * (`c.var.cache`) for its settlement and answer (docs/cache.md).
 */
import type { CacheSettings } from "../../contracts/config/cache.ts";
import type { CacheDecision } from "./policy.ts";

/** One request's cache state. */
export interface CacheState {
  settings: CacheSettings;
  decision: CacheDecision;
  /** `hit`: answered from the cache; `miss`: looked up, not found; `bypass`: not used. */
  result: "hit" | "miss" | "bypass";
  /** Bytes a hit served from the cache. */
  bytes: number;
}
