/**
 * Everything one edge isolate remembers between requests, in one object (docs/edge.md,
 * "Isolate state"): built once by the entry from the bindings, set on `c.var.edge`, and
 * passed down to what needs it. All of it is a cache or a queue that a new isolate rebuilds.
 */
import { CredentialRing } from "../contracts/credentials.ts";
import { DEFAULT_QUARANTINE_MS, OriginHealth } from "../contracts/origin-health.ts";
import { EdgeBreakers } from "./breakers.ts";
import { BrowserTokenMemo } from "./browser-tokens.ts";
import { CanaryCopies } from "./canaries.ts";
import { BatcherMemo } from "./delivery/batcher-memo.ts";
import { RetryBudget } from "./delivery/retry-budget.ts";
import { type AccountSettleQueue, accountSettleQueue } from "./key-auth.ts";
import { ApiKeyMemo } from "./keys.ts";
import { OriginPool } from "./origin-pool.ts";

/** The bindings an isolate's state talks to. */
export type EdgeBindings = Pick<Env, "ORIGIN_BREAKERS" | "CANARIES">;

/** One isolate's state; see the file header. */
export class EdgeState {
  /** The copy of the origins' breakers, and the direct attempts watching them. */
  readonly breakers: EdgeBreakers;
  /** The copies of the models' canaries. */
  readonly canaries: CanaryCopies;
  /** Load and failure memo of the origins this isolate sends to (breakers + quarantine). */
  readonly originPool: OriginPool;
  /** Retries at most a share of requests (`limits.retry_ratio`, `retry_floor`). */
  readonly retryBudget = new RetryBudget();
  /** Which credential each origin is on. */
  readonly credentialRing = new CredentialRing();
  /** When batchers last sent at once, and how long their HEADs took. */
  readonly batchers = new BatcherMemo();
  /** Settlements until their key's account holds them durably. */
  readonly settlements: AccountSettleQueue = accountSettleQueue();
  /** API keys already checked, and the derived check keys. */
  readonly apiKeys = new ApiKeyMemo();
  /** Browser-token secrets and CORS preflight answers. */
  readonly browserTokens = new BrowserTokenMemo();

  constructor(bindings: EdgeBindings) {
    this.breakers = new EdgeBreakers(bindings.ORIGIN_BREAKERS);
    this.canaries = new CanaryCopies(bindings.CANARIES);
    this.originPool = new OriginPool(new OriginHealth(DEFAULT_QUARANTINE_MS, this.breakers.cache));
  }
}
